"""SQLite schema as a list of small named migrations (simonw/llm style).

Each migration runs once, inside the same ``BEGIN IMMEDIATE`` transaction
that records its name in ``_migrations``, so several processes opening the
same file at once apply each migration exactly once. Never edit a released
migration: add a new function at the end of `MIGRATIONS`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

__all__ = ["MIGRATIONS", "migrate"]


def m001_sessions(db: sqlite3.Connection) -> None:
    # One row per session holds the heads of the log and every derived record,
    # so `version()` and the first step of `load()` are a single primary-key read.
    db.execute(
        """
        CREATE TABLE sessions (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            last_seq INTEGER NOT NULL DEFAULT 0,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            last_answer TEXT,
            last_answer_seq INTEGER NOT NULL DEFAULT 0,
            summary_text TEXT,
            summary_covers_seq INTEGER NOT NULL DEFAULT 0,
            summary_tokens INTEGER NOT NULL DEFAULT 0,
            summary_version INTEGER NOT NULL DEFAULT 0,
            summary_created_at INTEGER,
            constraints TEXT NOT NULL DEFAULT '[]',
            constraints_version INTEGER NOT NULL DEFAULT 0,
            emotions_version INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (tenant, session_id)
        ) WITHOUT ROWID
        """
    )
    db.execute("CREATE INDEX sessions_tenant_updated ON sessions (tenant, updated_at)")
    db.execute("CREATE INDEX sessions_updated ON sessions (updated_at)")


def m002_turns(db: sqlite3.Connection) -> None:
    # Rows are inserted once and never updated; the primary key doubles as the
    # "no gap, no duplicate" guard of the compare-and-set append.
    db.execute(
        """
        CREATE TABLE turns (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (tenant, session_id, seq)
        )
        """
    )


def m003_turn_emotions(db: sqlite3.Connection) -> None:
    # Emotion scores are derived records kept beside the log, with an index
    # that serves "strongest key moments before seq N" without a scan.
    db.execute(
        """
        CREATE TABLE turn_emotions (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            emotion REAL NOT NULL,
            PRIMARY KEY (tenant, session_id, seq)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        "CREATE INDEX turn_emotions_strength ON turn_emotions (tenant, session_id, emotion, seq)"
    )


def m004_jobs(db: sqlite3.Connection) -> None:
    db.execute(
        """
        CREATE TABLE jobs (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            job TEXT NOT NULL,
            ok INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            last_run INTEGER,
            PRIMARY KEY (tenant, session_id, job)
        ) WITHOUT ROWID
        """
    )


def m005_locks(db: sqlite3.Connection) -> None:
    # Job locks live in the same file so they work across processes of one host;
    # ``expires_at`` (Unix seconds) lets a crashed holder's lock lapse.
    db.execute(
        """
        CREATE TABLE job_locks (
            key TEXT PRIMARY KEY,
            token INTEGER NOT NULL,
            expires_at REAL NOT NULL
        ) WITHOUT ROWID
        """
    )
    db.execute("CREATE TABLE fence (id INTEGER PRIMARY KEY CHECK (id = 1), token INTEGER NOT NULL)")
    db.execute("INSERT INTO fence (id, token) VALUES (1, 0)")


def m006_idempotency(db: sqlite3.Connection) -> None:
    # Idempotency-Key records (docs/service.md): per tenant, the first request's
    # fingerprint and, once it finished, its response; ``expires_at`` in Unix seconds.
    # ``session_id`` ties a record to its session: erasing the session erases it.
    db.execute(
        """
        CREATE TABLE idempotency (
            tenant TEXT NOT NULL,
            key TEXT NOT NULL,
            session_id TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            status INTEGER NOT NULL,
            response TEXT NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (tenant, key)
        ) WITHOUT ROWID
        """
    )
    db.execute("CREATE INDEX idempotency_expiry ON idempotency (expires_at)")
    db.execute("CREATE INDEX idempotency_session ON idempotency (tenant, session_id)")


def m_jobs_rejected(db: sqlite3.Connection) -> None:
    # Jobs whose model output was rejected (schema failure, invented values) are counted apart.
    db.execute("ALTER TABLE jobs ADD COLUMN rejected INTEGER NOT NULL DEFAULT 0")


def m006_recall_postings(db: sqlite3.Connection) -> None:
    # The recall index beside the log (store/postings.py): one row per term and block
    # of 512 seqs, packed (seq, tf, dl) records appended with each turn; and the
    # session's index statistics. Existing sessions get theirs from `contextmode index`.
    db.execute(
        """
        CREATE TABLE recall_postings (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            term TEXT NOT NULL,
            block INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (tenant, session_id, term, block)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        """
        CREATE TABLE recall_index (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            indexed_seq INTEGER NOT NULL,
            docs INTEGER NOT NULL,
            total_len REAL NOT NULL,
            PRIMARY KEY (tenant, session_id)
        ) WITHOUT ROWID
        """
    )


def m006_turn_traces(db: sqlite3.Connection) -> None:
    # The kept trace of each exchange (what the model received), by exchange number;
    # ``created_at`` (Unix microseconds) serves the age limit of the retention setting.
    db.execute(
        """
        CREATE TABLE turn_traces (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (tenant, session_id, turn)
        ) WITHOUT ROWID
        """
    )


def m006_session_users(db: sqlite3.Connection) -> None:
    # The user a session belongs to (named by its first message), so a user can be
    # listed and forgotten across sessions without scanning them.
    db.execute("ALTER TABLE sessions ADD COLUMN user_id TEXT")
    db.execute(
        "CREATE INDEX sessions_user ON sessions (tenant, user_id, updated_at) WHERE user_id IS NOT NULL"
    )


def m007_deletions(db: sqlite3.Connection) -> None:
    # The audit log of forgets (who, when, scope, counts; never content). A row with
    # no ``finished_at`` is a forget cut off mid-way: the work list to resume.
    db.execute(
        """
        CREATE TABLE deletions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            tenant TEXT NOT NULL,
            scope TEXT NOT NULL,
            target TEXT NOT NULL,
            actor TEXT NOT NULL,
            started_at INTEGER NOT NULL,
            finished_at INTEGER,
            counts TEXT NOT NULL DEFAULT '{}'
        )
        """
    )


def m008_recall_frequencies(db: sqlite3.Connection) -> None:
    # Recall index layout 2 (store/postings.py): the open block's postings in small rows of
    # 32 seqs keyed block first (an append rewrites a few hundred bytes on a page or two,
    # not a growing 6 KB row per term), merged into `recall_postings` when the block seals;
    # and each term's document frequency over the sealed blocks in a row of its own (one
    # lookup instead of counting its postings), added to at each seal. Sessions indexed
    # before keep layout 1 until `contextmode index` converts them; meanwhile they count.
    db.execute(
        """
        CREATE TABLE recall_df (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            term TEXT NOT NULL,
            df INTEGER NOT NULL,
            PRIMARY KEY (tenant, session_id, term)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        """
        CREATE TABLE recall_recent (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            block INTEGER NOT NULL,
            term TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (tenant, session_id, block, term)
        ) WITHOUT ROWID
        """
    )
    db.execute("ALTER TABLE recall_index ADD COLUMN layout INTEGER NOT NULL DEFAULT 1")


def m009_traces_by_reference(db: sqlite3.Connection) -> None:
    # Traces refer to the turns and keep the other texts they repeat (system prompt, summary,
    # pins) once per session, by key, while a kept trace refers to them (``last_turn``: about
    # the newest such trace, `store.trace_pack.TEXT_TURN_SLACK`). ``turn_traces.body`` now
    # holds the packed trace (a BLOB); a row written before is JSON text and is read as such.
    # Both are rowid tables: a WITHOUT ROWID row keeps at most ~1 KB in its page and spills
    # the rest to an overflow page of its own, so a 3 KB trace took two pages.
    # (executescript would commit the migration's transaction: one statement at a time.)
    for statement in (
        """
        CREATE TABLE turn_traces_by_rowid (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY (tenant, session_id, turn)
        )
        """,
        """
        INSERT INTO turn_traces_by_rowid SELECT tenant, session_id, turn, created_at, body FROM turn_traces
        """,
        """
        DROP TABLE turn_traces
        """,
        """
        ALTER TABLE turn_traces_by_rowid RENAME TO turn_traces
        """,
        """
        CREATE TABLE trace_texts (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key TEXT NOT NULL,
            last_turn INTEGER NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY (tenant, session_id, key)
        )
        """,
    ):
        db.execute(statement)


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
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


def migrate(db: sqlite3.Connection) -> list[str]:
    """Apply the migrations this file lacks; return their names. ``db`` is in autocommit mode."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(
            "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        done = {row[0] for row in db.execute("SELECT name FROM _migrations")}
        applied = []
        for migration in MIGRATIONS:
            if migration.__name__ in done:
                continue
            migration(db)
            db.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (?, datetime('now'))",
                (migration.__name__,),
            )
            applied.append(migration.__name__)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return applied
