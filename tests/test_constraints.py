from __future__ import annotations

from autotune.space.constraints import violations
from autotune.space.spec import Constraint


def test_batched_tokens_must_cover_seqs():
    assert violations({"max_num_seqs": 512, "max_num_batched_tokens": 256})
    assert not violations({"max_num_seqs": 256, "max_num_batched_tokens": 256})
    assert not violations({"max_num_seqs": 512})  # the other is vLLM's default: vLLM judges


def test_no_chunked_prefill_needs_whole_prompt_batches():
    cfg = {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048, "max_model_len": 4096}
    assert "max_model_len" in violations(cfg)[0]


def test_fp8_kv_needs_bf16():
    assert violations({"kv_cache_dtype": "fp8", "dtype": "float16"})
    assert not violations({"kv_cache_dtype": "fp8", "dtype": "bfloat16"})


def test_tp_bounded_by_gpus():
    assert violations({"tensor_parallel_size": 2}, gpus=1)
    assert not violations({"tensor_parallel_size": 2}, gpus=2)


def test_partial_prefills():
    assert violations({"max_num_partial_prefills": 2, "max_long_partial_prefills": 3})
    assert violations({"max_num_partial_prefills": 2, "enable_chunked_prefill": False})


def test_user_constraints():
    rule = (Constraint("max_num_seqs", "<=", "128"),)
    assert violations({"max_num_seqs": 256}, rule) == ["max_num_seqs <= 128 (here 256 <= 128)"]
    assert not violations({"max_num_seqs": 64}, rule)
    assert not violations({}, rule)
