#!/usr/bin/env bash
# Installs the Debian packages Ottla's tests, benchmarks and Spark need, only when missing.
# zookeeper: the cluster's metadata store; tests start their own servers from its jars
# (/usr/share/java/zookeeper.jar, whose manifest names its dependencies) with their own
# config and data dirs, never the system service or /etc/zookeeper.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
[ -f /usr/share/java/slf4j-simple.jar ] || need+=(libslf4j-java)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing Debian packages: ${need[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
