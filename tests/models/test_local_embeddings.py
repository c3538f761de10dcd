"""`OpenAIEmbedder` against a real server: llama-cpp-python's, started with ``--embedding true``
on SmolLM2-135M (the ``local-model`` extra; under a truthy ``CI`` a missing extra fails).

A chat model without pooling answers one vector per token; the embedder mean-pools them, and
asks one text a request: llama-cpp-python 0.3 slices the token vectors of every input after a
batch's first at the wrong offset (the second text's vector had cosine -0.06 with the same text
sent alone). A handful of short texts: a few seconds of model time.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from contextmode.memory.recall.dense import OpenAIEmbedder
from contextmode.testing.ci import skip_or_fail
from contextmode.testing.local_model import LOCAL_MODEL_ALIAS, llama_server, local_model_ready

pytestmark = [pytest.mark.local_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def embeddings_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = local_model_ready()
    if missing is not None:
        skip_or_fail(f"the local-model extra is missing: {missing}")
    with llama_server(tmp_path_factory.mktemp("local-embeddings"), n_ctx=512, embedding=True) as base_url:
        yield base_url


def test_a_real_server_gives_unit_vectors_of_one_size(embeddings_url: str) -> None:
    embedder = OpenAIEmbedder(embeddings_url, LOCAL_MODEL_ALIAS, batch_size=2, timeout=60)
    texts = ["I love pottery on Sunday mornings.", "我最近在学吉他。", "I love pottery on Sunday mornings.",
             "The train was late."]
    vectors = embedder.embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (4, embedder.dim) and embedder.dim > 16
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0] * 4, abs=1e-5)
    assert np.array_equal(vectors[0], vectors[2])  # identical texts, identical vectors (across batches)
    assert not np.allclose(vectors[0], vectors[3])
    again = embedder.embed(["The train was late."])  # alone, as a query is: the same vector as in a batch
    assert again.shape == (1, embedder.dim) and np.allclose(again[0], vectors[3], atol=1e-5)
