"""The demo behind `make demo` (`python -m ottla.demo`); see `ottla.demo.run`."""
