"""The floor: a plain FastAPI append, side by side with ``flowmem serve`` in one run.

``python -m bench.floor [--dsn postgresql://127.0.0.1/test] [--rounds 5] [--clients 32]
[--seconds 5]``

The floor takes flowmem's append route and body, looks the bearer token's SHA-256 up
in PostgreSQL and inserts the turn's messages, one INSERT each, in one transaction
(psycopg pool, one uvicorn worker). Each round runs ``wrk`` (``bench/http.py``) on the
floor, then on ``flowmem serve`` (one worker), each in a fresh schema of the same
PostgreSQL. Prints the ratios per round and their medians: appends/s (the floor's over
flowmem's), serve CPU ms per append and PostgreSQL CPU ms per append (``/proc``: the CPU
of the backends of its connections, tagged by ``application_name``; the server must run
on this machine); flowmem's over the floor's. Not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import uuid

import psycopg
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel

from bench import http
from bench._common import cpu_seconds, interleaved, with_query


class Turn(BaseModel):  # flowmem's body shape: {"messages": [{"role", "content"}]}
    messages: list[dict[str, str]]


def floor_app(dsn: str) -> FastAPI:
    """The floor on ``dsn`` (whose ``search_path`` names its schema)."""
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(dsn, min_size=1, max_size=10, open=False)
    api = FastAPI(on_startup=[pool.open], on_shutdown=[pool.close])
    api.get("/healthz")(lambda: {"ok": True})

    @api.post("/v1/sessions/{session_id}/turns")
    async def turn(session_id: str, body: Turn, authorization: str = Header()) -> object:
        digest = hashlib.sha256(authorization.removeprefix("Bearer ").encode()).hexdigest()
        async with pool.connection() as conn, conn.transaction():
            found = await conn.execute("SELECT user_id FROM tokens WHERE digest = %s", (digest,))
            if await found.fetchone() is None:
                raise HTTPException(401)
            for m in body.messages:
                await conn.execute("INSERT INTO messages (session_id, role, content) "
                                   "VALUES (%s, %s, %s)", (session_id, m["role"], m["content"]))
        return {"success": True, "data": {"count": len(body.messages)}}
    return api


def _backends(dsn: str, app: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend named ``app`` (``/proc``: the server runs on
    this machine; one not readable: 0)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))]
    return {pid: cpu_seconds(pid) for pid in pids}


def _round(args: argparse.Namespace, name: str) -> tuple[float, float, float]:
    """One measurement of ``name`` (``floor`` or ``flowmem``): appends/s, serve CPU ms and
    PostgreSQL CPU ms (its backends') per append."""
    schema, secret = f"bench_{name}_{uuid.uuid4().hex[:8]}", f"fm_{uuid.uuid4().hex}"
    app = schema  # the application_name of its connections: their backends' CPU is its
    if name == "floor":
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}; SET search_path = {schema}; "
                         "CREATE TABLE tokens (digest text PRIMARY KEY, user_id text NOT NULL); "
                         "CREATE TABLE messages (id bigserial PRIMARY KEY, session_id text, "
                         "role text NOT NULL, content text NOT NULL)")
            conn.execute("INSERT INTO tokens VALUES (%s, 'bench')",
                         (hashlib.sha256(secret.encode()).hexdigest(),))
        dsn = with_query(args.dsn, f"options=-csearch_path%3D{schema}&application_name={app}")
        server = http.serving([sys.executable, "-m", "bench.floor", "--serve", dsn])
    else:
        secret = http.token(with_query(args.dsn, f"schema={schema}"), "bench")
        server = http.serve(with_query(args.dsn, f"schema={schema}&application_name={app}"))
    with server as (base, pid):
        sids = (http.sessions(base, secret, args.clients) if name == "flowmem"
                else [uuid.uuid4().hex for _ in range(args.clients)])  # any id: only the token
        before = _backends(args.dsn, app)
        f = http.measure_wrk(base, secret, sids, args.seconds, pid)
        after = _backends(args.dsn, app)
    with psycopg.connect(args.dsn, autocommit=True) as conn:  # a shared database: tidy up
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    pg_cpu = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items()) * 1000 / max(
        f["appends"], 1)
    print(f"{name}: {f['rate']:,.0f} appends/s, {f['server_cpu']:.3f} ms serve CPU/append, "
          f"{pg_cpu:.3f} ms PostgreSQL CPU/append, load {os.getloadavg()[0]:.1f}",
          file=sys.stderr, flush=True)
    return f["rate"], f["server_cpu"], pg_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag, default in (("--dsn", "postgresql://127.0.0.1/test"), ("--rounds", 5),
                          ("--clients", 32), ("--seconds", 5.0),
                          ("--serve", ""), ("--port", 0)):  # --serve DSN: the floor itself
        parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args()
    if args.serve:
        import uvicorn
        uvicorn.run(floor_app(args.serve), port=args.port, http="httptools", log_level="warning")
        return 0
    got = interleaved(args.rounds, {name: lambda name=name: _round(args, name)
                                    for name in ("floor", "flowmem")})
    print(f"{args.rounds} interleaved rounds, {args.clients} clients; flowmem serve against the "
          "floor, medians (per round):")
    for at, what, spec in ((0, "appends/s", ",.0f"), (1, "serve CPU ms/append", ".3f"),
                           (2, "PostgreSQL CPU ms/append", ".3f")):
        pairs = [(floor[at], fm[at]) for floor, fm in zip(got["floor"], got["flowmem"],
                                                             strict=True) if floor[at] > 0]
        ratios = [floor / fm if at == 0 else fm / floor for floor, fm in pairs]
        if ratios:  # appends/s: the floor's over flowmem's; CPU: flowmem's over the floor's
            print(f"{what}: floor {statistics.median(p[0] for p in pairs):{spec}}, flowmem "
                  f"{statistics.median(p[1] for p in pairs):{spec}}; ratio "
                  f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
