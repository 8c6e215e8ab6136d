#!/usr/bin/env bash
# Installs what the test suite needs and is missing, on Debian 12. Idempotent:
# a second run only checks. Uses Debian's packages, Maven Central and PyPI only.
#
#   scripts/setup.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- Debian packages ---------------------------------------------------------

# cmake + libcurl: rdkafka's cmake-build; zip/unzip: the Lambda package;
# chromium + chromium-driver: the browser tests of `skein ui` (tests/ui.rs);
# util-linux: taskset, which the source-sizing tests pin a run's cores with.
DEB_PACKAGES=(build-essential pkg-config cmake libcurl4-openssl-dev zlib1g-dev
              redis-server zip unzip curl ca-certificates python3 python3-venv
              chromium chromium-driver util-linux)

java_major() {
    # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1
}

install_debian_packages() {
    local missing=() pkg
    for pkg in "${DEB_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    if ! command -v java >/dev/null || [[ "$(java_major)" -lt 17 ]]; then
        missing+=(openjdk-17-jre-headless)
    fi
    command -v mvn >/dev/null || missing+=(maven)

    if ((${#missing[@]} == 0)); then
        log "Debian packages: all present"
        return
    fi
    log "Debian packages: installing ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# --- Rust --------------------------------------------------------------------

check_rust() {
    # Debian's rustc is far too old for edition 2024, and toolchains cannot be
    # downloaded from here: the machine must already have rustup's stable.
    command -v cargo >/dev/null \
        || die "cargo not found: install a stable Rust toolchain (>= 1.94) first"
    log "Rust: $(cargo --version)"
}

# --- Apache Kafka jars from Maven Central -------------------------------------

fetch_kafka() {
    if [[ -f "$KAFKA_LIBS/.complete" ]]; then
        log "Kafka $KAFKA_VERSION: jars present in $KAFKA_LIBS"
        return
    fi
    log "Kafka $KAFKA_VERSION: fetching jars from Maven Central into $KAFKA_LIBS"
    local work
    work="$(mktemp -d)"
    # The broker (kafka_2.13) and StorageTool's dependencies (kafka-tools), with
    # log4j2 as the slf4j binding. connect-runtime is not needed by a broker and
    # brings in a web server's worth of jars.
    cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>skein</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$KAFKA_VERSION</version>
      <exclusions>
        <exclusion>
          <groupId>org.apache.kafka</groupId>
          <artifactId>connect-runtime</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    # Copy into a temporary directory and rename at the end, so an interrupted
    # fetch never leaves a half-filled libs directory that looks complete.
    mvn -B -q -Dstyle.color=never -f "$work/pom.xml" \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$work/libs" \
        || die "mvn could not fetch the Kafka jars (is Maven Central reachable?)"
    touch "$work/libs/.complete"
    mkdir -p "$(dirname "$KAFKA_LIBS")"
    rm -rf "$KAFKA_LIBS"
    mv "$work/libs" "$KAFKA_LIBS"
    rm -rf "$work"
    log "Kafka $KAFKA_VERSION: $(find "$KAFKA_LIBS" -name '*.jar' | wc -l) jars, $(du -sh "$KAFKA_LIBS" | cut -f1)"
}

# --- Python packages from PyPI, each in a venv of its own ---------------------

# install_venv DIR PACKAGE VERSION [REQUIREMENT]: PACKAGE==VERSION in the venv
# DIR (REQUIREMENT, e.g. with extras, is what pip installs), unless it is there.
install_venv() {
    local dir=$1 package=$2 version=$3 requirement=${4:-$2==$3} have=""
    if [[ -x "$dir/bin/python" ]]; then
        have="$("$dir/bin/python" -m pip show "$package" 2>/dev/null \
                | sed -n 's/^Version: //p')" || true
    fi
    if [[ "$have" == "$version" ]]; then
        log "$package $version: present in $dir"
        return
    fi
    log "$package $version: installing into $dir"
    # Debian's own python3 (with python3-venv) so the result does not depend on
    # whatever other interpreter happens to be first on PATH.
    local py=/usr/bin/python3
    [[ -x $py ]] || py="$(command -v python3)"
    rm -rf "$dir"
    "$py" -m venv "$dir"
    "$dir/bin/python" -m pip install -q "$requirement" \
        || die "pip could not install $requirement"
}

start=$SECONDS
install_debian_packages
check_rust
fetch_kafka
install_venv "$MINISTACK_VENV" ministack "$MINISTACK_VERSION"
# tests/formats writes its topics with confluent-kafka's Avro and Protobuf
# serializers, as real producers do (tests/formats/confluent_produce.py).
install_venv "$FORMATS_VENV" confluent-kafka "$CONFLUENT_KAFKA_VERSION" \
    "confluent-kafka[avro,protobuf,schemaregistry]==$CONFLUENT_KAFKA_VERSION"
log "setup done in $((SECONDS - start)) s"
