"""PostgreSQL schema as a list of small named migrations, applied under an advisory lock.

Every table lives in the store's own schema (``contextmode`` by default), so
several stores (or test runs) can share one database without colliding.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["KEY_MOMENT_FLOOR", "MIGRATIONS", "migrate"]

KEY_MOMENT_FLOOR = 0.5
"""Emotion at or above which a score is in the partial strength index (m003)."""

Conn = Any  # asyncpg.Connection, imported lazily


async def m001_sessions(db: Conn) -> None:
    await db.execute(
        """
        CREATE TABLE sessions (
            tenant text NOT NULL,
            session_id text NOT NULL,
            last_seq bigint NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            last_answer text,
            last_answer_seq bigint NOT NULL DEFAULT 0,
            summary_text text,
            summary_covers_seq bigint NOT NULL DEFAULT 0,
            summary_tokens integer NOT NULL DEFAULT 0,
            summary_version integer NOT NULL DEFAULT 0,
            summary_created_at timestamptz,
            constraints jsonb NOT NULL DEFAULT '[]',
            constraints_version integer NOT NULL DEFAULT 0,
            emotions_version bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (tenant, session_id)
        );
        CREATE INDEX sessions_tenant_updated ON sessions (tenant, updated_at DESC);
        CREATE INDEX sessions_updated ON sessions (updated_at);
        """
    )


async def m002_turns(db: Conn) -> None:
    # Written once, never updated: the primary key rejects any duplicate seq.
    await db.execute(
        """
        CREATE TABLE turns (
            tenant text NOT NULL,
            session_id text NOT NULL,
            seq bigint NOT NULL,
            role text NOT NULL,
            content text NOT NULL,
            tokens integer NOT NULL,
            created_at timestamptz NOT NULL,
            metadata jsonb NOT NULL DEFAULT '{}',
            PRIMARY KEY (tenant, session_id, seq)
        );
        """
    )


async def m003_turn_emotions(db: Conn) -> None:
    await db.execute(
        """
        CREATE TABLE turn_emotions (
            tenant text NOT NULL,
            session_id text NOT NULL,
            seq bigint NOT NULL,
            emotion double precision NOT NULL,
            -- INCLUDE makes "the emotion of turn N" an index-only primary-key probe.
            PRIMARY KEY (tenant, session_id, seq) INCLUDE (emotion)
        );
        -- Partial: only turns strong enough to be key moments (KEY_MOMENT_FLOOR). Queries
        -- by seq cannot use it, so they always take the primary key, even before the
        -- first ANALYZE of a bulk-loaded table.
        CREATE INDEX turn_emotions_strength
            ON turn_emotions (tenant, session_id, emotion DESC, seq DESC) WHERE emotion >= 0.5;
        """
    )


async def m004_jobs(db: Conn) -> None:
    await db.execute(
        """
        CREATE TABLE jobs (
            tenant text NOT NULL,
            session_id text NOT NULL,
            job text NOT NULL,
            ok integer NOT NULL DEFAULT 0,
            failed integer NOT NULL DEFAULT 0,
            last_error text,
            last_run timestamptz,
            PRIMARY KEY (tenant, session_id, job)
        );
        """
    )


async def m005_locks(db: Conn) -> None:
    # A lock table rather than session advisory locks: it honours ``ttl_s`` even
    # when a holder hangs, works through poolers, and the sequence gives fencing tokens.
    await db.execute(
        """
        CREATE TABLE job_locks (
            key text PRIMARY KEY,
            token bigint NOT NULL,
            expires_at timestamptz NOT NULL
        );
        CREATE SEQUENCE fence;
        """
    )


async def m006_idempotency(db: Conn) -> None:
    # Idempotency-Key records (docs/service.md): per tenant, the first request's
    # fingerprint and, once it finished, its response. ``session_id`` ties a record
    # to its session: erasing the session erases it.
    await db.execute(
        """
        CREATE TABLE idempotency (
            tenant text NOT NULL,
            key text NOT NULL,
            session_id text NOT NULL,
            fingerprint text NOT NULL,
            status integer NOT NULL,
            response text NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (tenant, key)
        );
        CREATE INDEX idempotency_expiry ON idempotency (expires_at);
        CREATE INDEX idempotency_session ON idempotency (tenant, session_id);
        """
    )


async def m_jobs_rejected(db: Conn) -> None:
    # Jobs whose model output was rejected (schema failure, invented values) are counted apart.
    await db.execute("ALTER TABLE jobs ADD COLUMN rejected integer NOT NULL DEFAULT 0")


async def m006_recall_postings(db: Conn) -> None:
    # The recall index beside the log (store/postings.py): one row per term and block
    # of 512 seqs, packed (seq, tf, dl) records appended with each turn; and the
    # session's index statistics. Existing sessions get theirs from `contextmode index`.
    await db.execute(
        """
        CREATE TABLE recall_postings (
            tenant text NOT NULL,
            session_id text NOT NULL,
            term text NOT NULL,
            block integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (tenant, session_id, term, block)
        );
        CREATE TABLE recall_index (
            tenant text NOT NULL,
            session_id text NOT NULL,
            indexed_seq bigint NOT NULL,
            docs bigint NOT NULL,
            total_len float8 NOT NULL,
            PRIMARY KEY (tenant, session_id)
        );
        """
    )


async def m006_turn_traces(db: Conn) -> None:
    # The kept trace of each exchange (what the model received), by exchange number.
    await db.execute(
        """
        CREATE TABLE turn_traces (
            tenant text NOT NULL,
            session_id text NOT NULL,
            turn integer NOT NULL,
            created_at timestamptz NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (tenant, session_id, turn)
        )
        """
    )


async def m006_session_users(db: Conn) -> None:
    # The user a session belongs to, so a user can be listed and forgotten across sessions.
    await db.execute(
        """
        ALTER TABLE sessions ADD COLUMN user_id text;
        CREATE INDEX sessions_user ON sessions (tenant, user_id, updated_at DESC)
            WHERE user_id IS NOT NULL;
        """
    )


async def m007_deletions(db: Conn) -> None:
    # The audit log of forgets (no content); finished_at NULL = a forget to resume.
    await db.execute(
        """
        CREATE TABLE deletions (
            id bigserial PRIMARY KEY,
            tenant text NOT NULL,
            scope text NOT NULL,
            target text NOT NULL,
            actor text NOT NULL,
            started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            finished_at timestamptz,
            counts jsonb NOT NULL DEFAULT '{}'
        );
        """
    )


async def m008_recall_frequencies(db: Conn) -> None:
    # Recall index layout 2 (store/postings.py): the open block's postings in small rows of
    # 32 seqs keyed block first (an append no longer rewrites a growing 6 KB row and its
    # TOAST per term), merged into recall_postings when the block seals; each term's
    # document frequency over the sealed blocks in a row of its own, added to at each seal.
    # Sessions indexed before keep layout 1 until `contextmode index` converts them.
    await db.execute(
        """
        CREATE TABLE recall_df (
            tenant text NOT NULL,
            session_id text NOT NULL,
            term text NOT NULL,
            df bigint NOT NULL,
            PRIMARY KEY (tenant, session_id, term)
        );
        CREATE TABLE recall_recent (
            tenant text NOT NULL,
            session_id text NOT NULL,
            block integer NOT NULL,
            term text NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (tenant, session_id, block, term)
        );
        ALTER TABLE recall_index ADD COLUMN layout integer NOT NULL DEFAULT 1;
        """
    )


async def m009_traces_by_reference(db: Conn) -> None:
    # Traces refer to the turns and keep the other texts they repeat (system prompt, summary,
    # pinned values) once per session in ``trace_texts`` (``last_turn``: about the newest
    # trace referring to it, `store.trace_pack.TEXT_TURN_SLACK` behind at most).
    # ``turn_traces.packed`` holds the packed trace; ``body`` (JSON) is left for rows
    # written before, and read as such.
    await db.execute(
        """
        ALTER TABLE turn_traces ALTER COLUMN body DROP NOT NULL;
        ALTER TABLE turn_traces ADD COLUMN packed bytea;
        CREATE TABLE trace_texts (
            tenant text NOT NULL,
            session_id text NOT NULL,
            key text NOT NULL,
            last_turn integer NOT NULL,
            body bytea NOT NULL,
            PRIMARY KEY (tenant, session_id, key)
        ) WITH (fillfactor = 80);
        ALTER TABLE sessions SET (fillfactor = 50, toast_tuple_target = 256);
        """
    )


MIGRATIONS: list[Callable[[Conn], Awaitable[None]]] = [
    m001_sessions,
    m002_turns,
    m003_turn_emotions,
    m004_jobs,
    m005_locks,
    m006_idempotency,
    m_jobs_rejected,
    m006_recall_postings,
    m006_turn_traces,
    m006_session_users,
    m007_deletions,
    m008_recall_frequencies,
    m009_traces_by_reference,
]


async def migrate(db: Conn, schema: str) -> list[str]:
    """Create ``schema`` and apply the migrations it lacks; return their names."""
    async with db.transaction():
        # One migrator at a time across every process and host.
        await db.execute("SELECT pg_advisory_xact_lock(hashtext('contextmode:migrate'))")
        await db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await db.execute(f'SET LOCAL search_path TO "{schema}"')
        await db.execute(
            "CREATE TABLE IF NOT EXISTS _migrations"
            " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["name"] for r in await db.fetch("SELECT name FROM _migrations")}
        applied = []
        for migration in MIGRATIONS:
            if migration.__name__ in done:
                continue
            await migration(db)
            await db.execute("INSERT INTO _migrations (name) VALUES ($1)", migration.__name__)
            applied.append(migration.__name__)
    return applied
