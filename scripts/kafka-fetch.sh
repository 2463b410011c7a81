#!/usr/bin/env bash
# Assemble an Apache Kafka 4.x broker from Maven Central jars (no release tarball is reachable here):
#   .cache/kafka/<version>/lib/*.jar                 the broker classpath (kafka.Kafka, kafka.tools.StorageTool)
#   .cache/kafka/<version>/config/log4j2.properties  the broker's log config (from scripts/kafka/)
#   .cache/kafka/<version>/.stamp                    what was fetched; a matching stamp makes a rerun a no-op
# The version is kafka.version in scripts/kafka/pom.xml unless KAFKA_VERSION is set; log4j follows
# Kafka's own pin for that line (LOG4J_VERSION overrides). fleetloop.daemon.brokers.apache reads
# the same pom and cache layout. Needs java 17+ and mvn (both on the project's machines).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pom="$root/scripts/kafka/pom.xml"
log_config="$root/scripts/kafka/log4j2.properties"
cache_root="${FLEETLOOP_KAFKA_CACHE:-$root/.cache/kafka}"

pom_property() { # the default of a <name>value</name> property in the pom
    sed -n "s:.*<$1>\([^<]*\)</$1>.*:\1:p" "$pom" | head -n 1
}

version="${KAFKA_VERSION:-$(pom_property kafka.version)}"
if [[ -n "${LOG4J_VERSION:-}" ]]; then
    log4j="$LOG4J_VERSION"
elif [[ -z "${KAFKA_VERSION:-}" ]]; then
    log4j="$(pom_property log4j.version)"
else
    case "$version" in # Kafka's log4j2 pin per line (gradle/dependencies.gradle upstream)
        4.0.* | 4.1.*) log4j=2.24.3 ;;
        *) log4j=2.25.3 ;;
    esac
fi
[[ "$version" =~ ^4\.[0-9]+\.[0-9]+$ ]] || { echo "kafka-fetch: expected a 4.x.y version, got '$version'" >&2; exit 2; }

home="$cache_root/$version"
stamp="$home/.stamp"
want="kafka=$version log4j=$log4j pom=$(sha256sum "$pom" | cut -c1-16) log4j2.properties=$(sha256sum "$log_config" | cut -c1-16)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -d "$home/lib" ]]; then
    echo "kafka-fetch: Apache Kafka $version already cached in ${home#"$root/"} ($(find "$home/lib" -name '*.jar' | wc -l) jars)"
    exit 0
fi

command -v mvn >/dev/null || { echo "kafka-fetch: needs Maven (mvn) on PATH, e.g. apt-get install maven" >&2; exit 1; }
command -v java >/dev/null || { echo "kafka-fetch: needs Java 17+ on PATH, e.g. apt-get install openjdk-17-jre-headless" >&2; exit 1; }

mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/.fetch-$version.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Maven Central only (the pom declares no other repository). Its output is shown only on failure.
if ! mvn -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
    -Dkafka.version="$version" -Dlog4j.version="$log4j" \
    -DincludeScope=runtime -DoutputDirectory="$work/lib" >"$work/mvn.log" 2>&1; then
    tail -n 40 "$work/mvn.log" >&2
    echo "kafka-fetch: mvn could not resolve Apache Kafka $version (log4j $log4j) from Maven Central" >&2
    exit 1
fi
rm -f "$work/mvn.log"

for jar in "kafka_2.13-$version.jar" "log4j-slf4j-impl-$log4j.jar" "log4j-core-$log4j.jar" "log4j-api-$log4j.jar"; do
    [[ -f "$work/lib/$jar" ]] || { echo "kafka-fetch: $jar missing after mvn" >&2; exit 1; }
done
mkdir -p "$work/config"
cp "$log_config" "$work/config/log4j2.properties"
echo "$want" >"$work/.stamp"

# Swap the finished directory in whole, so an interrupted fetch never looks complete.
rm -rf "$home"
mv "$work" "$home"
trap - EXIT
echo "kafka-fetch: fetched Apache Kafka $version (log4j $log4j) from Maven Central into ${home#"$root/"} ($(find "$home/lib" -name '*.jar' | wc -l) jars)"
