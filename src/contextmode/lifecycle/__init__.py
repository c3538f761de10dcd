"""Data lifecycle: users, forget (verified erasure), retention, export, import and migrate.

See docs/lifecycle.md. The store side lives in `contextmode.store.lifecycle`.
"""

from .export import (
    FORMAT,
    VERSION,
    Footer,
    ImportReport,
    export_records,
    import_records,
    store_digest,
)
from .forget import LocalCaches, forget, lifecycle_store, resume_forgets
from .migrate import MigrateReport, migrate, read_export, write_export
from .sync import CacheHolder, ForgetWatcher

__all__ = [
    "FORMAT",
    "VERSION",
    "CacheHolder",
    "Footer",
    "ForgetWatcher",
    "ImportReport",
    "LocalCaches",
    "MigrateReport",
    "export_records",
    "forget",
    "import_records",
    "lifecycle_store",
    "migrate",
    "read_export",
    "resume_forgets",
    "store_digest",
    "write_export",
]
