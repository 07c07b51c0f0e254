#!/bin/bash
# kafka-run-class.sh CLASS ARGS...: the class on Kafka's jars, logging to stdout, with
# KAFKA_HEAP_OPTS (default 512 MiB) as apache/kafka's scripts take it.
set -euo pipefail
class=$1
shift
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
  -cp '/opt/kafka/libs/*' "$class" "$@"
