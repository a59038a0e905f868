"""Client-side CLI commands (topics, produce, consume, ...); filled in as they land."""


def add_commands(commands) -> None:
    return None
