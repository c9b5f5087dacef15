#!/usr/bin/env bash
# Makes sure Redis, RabbitMQ and PostgreSQL answer on loopback, starting whichever does not.
# The commands are the ones this machine's image uses to start them.
set -euo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {  # name port seconds
    local name=$1 port=$2 deadline=$((SECONDS + $3))
    until port_open "$port"; do
        if ((SECONDS >= deadline)); then
            echo "services: $name did not open 127.0.0.1:$port within $3 s" >&2
            return 1
        fi
        sleep 1
    done
}

start_redis() {
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
}

start_postgres() {
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
}

start_rabbitmq() {
    rabbitmq-server -detached
    # The node accepts AMQP connections only after its boot steps finish; await_startup waits for that.
    timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
}

ensure() {  # name port starter seconds
    local name=$1 port=$2 starter=$3 seconds=$4
    if port_open "$port"; then
        echo "services: $name is up on 127.0.0.1:$port"
        return 0
    fi
    echo "services: $name is down; starting it"
    if ! command -v "${5:-$name}" >/dev/null 2>&1 && [[ -n ${5:-} ]]; then
        echo "services: ${5} is not installed; cannot start $name" >&2
        return 1
    fi
    $starter
    wait_port "$name" "$port" "$seconds"
    echo "services: $name started"
}

ensure redis 6379 start_redis 30 redis-server
ensure postgresql 5432 start_postgres 60 pg_ctlcluster
ensure rabbitmq 5672 start_rabbitmq 120 rabbitmq-server
