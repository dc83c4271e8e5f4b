"""The PostgreSQL fixture itself, and autotune's storage on it."""

from autotune.study import open_storage
from autotune.study.claims import Claims
from tests.postgres import postgres_url  # noqa: F401 - a fixture


def test_claims_are_exclusive_on_postgresql(postgres_url):  # noqa: F811
    import optuna

    storage = open_storage(postgres_url)
    optuna.create_study(study_name="claims", storage=storage)
    claims = Claims(storage.engine, storage.get_study_id_from_name("claims"))
    assert claims.claim('{"dtype": "float32"}', 1) == 1
    assert claims.claim('{"dtype": "float32"}', 2) == 1  # taken: the holder is returned
    claims.release('{"dtype": "float32"}', 1)
    assert claims.claim('{"dtype": "float32"}', 3) == 3
