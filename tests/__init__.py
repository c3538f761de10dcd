"""The test suite: one folder per package of src/contextmode (tests/store/ for contextmode.store, …).

Every folder is a package, so tests share helpers by absolute import
(``from tests.service.test_service import make_engine``) and two folders may hold files of the same name.
"""
