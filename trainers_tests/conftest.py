import os

# Nothing in the suite may touch the network: fail fast instead of waiting for a hub that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# two threads in one process; one in each pytest-xdist worker (scripts/test.sh starts two on two cores)
torch.set_num_threads(int(os.environ.get("TRL_VARIANTS_TEST_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER")
                                         else "2")))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    from trl_variants.default import DEFAULT_MODEL_PATH

    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


@pytest.fixture
def tiny_model():
    from transformers import AutoModelForCausalLM

    from trl_variants.default import DEFAULT_MODEL_PATH

    return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32)
