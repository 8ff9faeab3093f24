"""Scale-out benchmark: N serve replicas on ONE private PostgreSQL, direct and through
pgbouncer: appends/s, p99, serve and PostgreSQL CPU and transactions per append.

``python -m bench.scale_out [--replicas 1,2,4] [--modes direct,pgbouncer]
[--clients 32] [--seconds 8] [--rate R[,R2…]] [--per-replica]``

``--rate``: about R appends/s offered in all (each client waits after a reply), below
what one replica serves: then CPU per append shows what a replica adds, not how two
cores shared by more processes slow them all. Several rates: each replica count at
each (one replica at a quarter of the rate carries what each of four carries).
``--per-replica``: R appends/s for each replica (N replicas are offered N × R): the
load grows with the replicas, as when replicas are added for it.

A private server (``tests/support/postgres_private.py``) so its CPU and
``pg_stat_database.xact_commit`` count this benchmark alone; ``flowmem serve
--workers N`` behind a fresh pgbouncer (``default_pool_size = 2 × N``;
change notices LISTEN on the server itself) in pgbouncer mode; load from
``wrk`` as in ``bench/http.py``. Prints a markdown table (docs/deploy.md). Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator

import psycopg

from bench._common import SUPPORT, cpu_seconds
from bench.http import measure_wrk, serve, sessions, token

sys.path.insert(0, SUPPORT)
import postgres_private
from pgbouncer_support import pgbouncer_at

STATS_SETTLE = 12.0  # backends flush their statistics at most every 10 s when idle
BOUNCER_POOL = 2  # pgbouncer's default_pool_size per serve replica


def _xacts(dsn: str) -> int:
    """This database's committed transactions, once the count stops moving (polled in ONE
    transaction of its own, subtracted by the caller)."""
    with psycopg.connect(dsn) as conn:
        last, since = -1, time.monotonic()
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT xact_commit FROM pg_stat_database "
                               "WHERE datname = current_database()").fetchone()
            now = int(row[0]) if row else 0
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= STATS_SETTLE:
                return now
            time.sleep(0.5)


@contextlib.contextmanager
def _store(mode: str, server: postgres_private.PrivatePostgres, schema: str,
           replicas: int) -> Iterator[str]:
    direct = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    if mode == "direct":
        yield f"{direct}?schema={schema}"
        return
    with pgbouncer_at("127.0.0.1", server.port, "postgres", "postgres",
                      BOUNCER_POOL * replicas) as (address, user):
        yield (f"postgresql://{user}@{address}/flowmem?schema={schema}&prepared=false"
               f"&listen={direct}")


def run(args: argparse.Namespace) -> list[str]:
    server = postgres_private.start()
    if isinstance(server, str):
        raise SystemExit(f"cannot start a private PostgreSQL: {server}")
    dsn = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    rows: list[str] = []
    try:
        for mode, replicas, rate in ((m, int(n), float(r) * (int(n) if args.per_replica else 1))
                                     for m in args.modes.split(",")
                                     for n in args.replicas.split(",")
                                     for r in args.rate.split(",")):
            schema = f"scale_{mode}_{replicas}_{int(rate)}"
            secret = token(f"{dsn}?schema={schema}", "bench")  # creates the schema directly
            with _store(mode, server, schema, replicas) as url, \
                    serve(url, workers=replicas) as (base, pid):
                sids = sessions(base, secret, args.clients)
                before = _xacts(dsn)
                pg_before = cpu_seconds(server.postmaster())
                pace = round(args.clients * 1000 / rate) if rate else 0
                figures = measure_wrk(base, secret, sids, args.seconds, pid, pace_ms=pace)
                pg_cpu = cpu_seconds(server.postmaster()) - pg_before
                after = _xacts(dsn)
            n, offered = max(figures["appends"], 1), f"{rate:g}" if rate else "—"
            rows.append(f"| {mode} | {replicas} | {offered} | {args.clients} | "
                        f"{figures['appends']} | {figures['rate']:,.0f} | "
                        f"{figures['p99_ms']:.1f} | "
                        f"{figures['server_cpu']:.2f} | {pg_cpu * 1000 / n:.2f} | "
                        f"{(after - before - 1) / n:.3f} | {os.getloadavg()[0]:.2f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        server.remove()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--modes", default="direct,pgbouncer")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", default="0",
                        help="offer about this many appends/s in all (0: as many as served)")
    parser.add_argument("--per-replica", action="store_true",
                        help="--rate is for each replica")
    rows = run(parser.parse_args(argv))
    print("| mode | serve replicas | offered/s | clients | appends | appends/s | p99 ms | "
          "serve CPU ms/append | PostgreSQL CPU ms/append | transactions/append | load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
