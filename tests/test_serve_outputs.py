"""scenario=serve's output check (issue 62 item 3): each completed request's tokens against its
prompt decoded alone, after the window; a planted padding or mask bug is caught.

The seeded tiny Llama echoes its last prompt token (tied embeddings, small random attention:
the residual stream is the token's own embedding), so attention bugs cannot change its tokens.
The in-process tests sharpen its attention projections (x8) so that every token depends on the
context; the multi-framework test runs the seeded weights as a user gets them (its check there
catches a request given another prompt, row or position, not a mixing of attention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxtrack.scenarios.serve import runner as serve

SHARPEN = 8.0  # attention projections scaled by this: the tiny model's tokens follow its context


def _records(outputs, references):
    reqs = [serve.Request(i, 0.0, len(ref), prompt_len=4) for i, ref in enumerate(references)]
    for r, got in zip(reqs, outputs):
        r.token_s, r.output_ids = [0.1] * r.new_tokens, list(got)
    return reqs


def test_a_request_served_other_tokens_is_counted_at_its_first_differing_position():
    references = [[5, 6, 7], [1, 2, 3], [9, 9, 9], [4, 4, 4]]
    reqs = _records([[5, 6, 7], [1, 0, 3], [9, 9, 8], [4, 4, 4]], references)
    reqs[3].failed = "timeout"  # a failed request has no tokens to judge
    serve.check_outputs(reqs, lambda r: references[r.id])
    figures = serve.output_metrics(reqs)
    assert figures == {"serve_output_checked_requests": 3.0, "mismatched_requests": 2.0,
                       "first_mismatch_position": 1.0}
    assert [r.first_mismatch for r in reqs] == [None, 1, 2, None]
    assert serve.output_tags(figures) == {"serve_outputs": "mismatch",
                                          "serve_outputs_mismatch": "true"}
    rows = [r.row() for r in reqs]  # the artifact recomputes the count
    assert sum(r["first_mismatch"] is not None for r in rows if r["checked"]) == 2


def test_a_request_outside_the_sample_is_not_counted_as_checked():
    reqs = _records([[1, 2], [3, 4]], [[1, 2], [3, 4]])
    serve.check_outputs(reqs, lambda r: None if r.id else [1, 2])
    figures = serve.output_metrics(reqs)
    assert figures == {"serve_output_checked_requests": 1.0, "mismatched_requests": 0.0}
    assert serve.output_tags(figures)["serve_outputs"] == "match"
    assert serve.output_tags({})["serve_outputs"] == "not_checked"


def _sharpened_torch(monkeypatch):
    """The torch backend's built Llama with its attention projections scaled by SHARPEN."""
    import torch

    from fxtrack.frameworks.torch.backend import TorchBackend

    build = TorchBackend.build

    def sharpened(self, batch_size):
        build(self, batch_size)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    p.mul_(SHARPEN)

    monkeypatch.setattr(TorchBackend, "build", sharpened)


def _serve_torch(tmp_path, policy):
    from conftest import job_spec

    from fxtrack.worker.__main__ import run

    options = {"prompt_len": 8, "new_tokens": 6, "rate": "20", "num_requests": 12,
               "max_batch": 3, "batching": policy, "length_dist": "lognormal", "slo": {}}
    spec = job_spec("torch", "llama", tmp_path, scenario="serve",
                    runner="fxtrack.scenarios.serve.runner:run", options=options, batch_size=None,
                    warmup_steps=1)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    rows = json.loads(Path(result.artifacts["serve_requests"]).read_text())
    return result, rows


def _plant(monkeypatch, policy):
    """A padding bug in torch's batched decode. static: the decode step's attention mask
    dropped (every cache position visible, the zeros not written yet included); continuous: a
    slot's position left at its padded prompt's end (the padding's K/V visible, its tokens
    decoded at the wrong positions)."""
    if policy == "static":
        import torch.nn.functional as F

        from fxtrack.frameworks.torch import models

        sdpa = F.scaled_dot_product_attention

        def unmasked(*args, attn_mask=None, **kwargs):
            return sdpa(*args, **kwargs)

        monkeypatch.setattr(models.F, "scaled_dot_product_attention", unmasked)
    else:
        from fxtrack.frameworks.torch import slots

        prefill = slots.TorchSlots.prefill

        def padded_position(self, slot, prompt_len):
            done = prefill(self, slot, prompt_len)
            self.pos[slot, 0] = min(b for b in self.buckets if b >= prompt_len)
            return done

        monkeypatch.setattr(slots.TorchSlots, "prefill", padded_position)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_torch_serves_each_prompt_what_it_decodes_alone(policy, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    _sharpened_torch(monkeypatch)
    result, rows = _serve_torch(tmp_path, policy)
    m, tags = result.metrics, result.tags
    assert m["serve_output_checked_requests"] == m["serve_percentile_requests"] == 12
    assert m["mismatched_requests"] == 0 and "first_mismatch_position" not in m
    assert tags["serve_outputs"] == "match" and tags["serve_outputs_mismatch"] == "false"
    assert m["serve_output_check_s"] > 0
    assert all(r["checked"] and r["first_mismatch"] is None for r in rows)
    if policy == "continuous":  # prompts padded to a bucket longer than themselves were served
        buckets = [int(b) for b in tags["serve_prompt_buckets"].split(",")]
        assert any(r["prompt_len"] not in buckets for r in rows)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_a_planted_padding_bug_is_caught(policy, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    _sharpened_torch(monkeypatch)
    _plant(monkeypatch, policy)
    result, rows = _serve_torch(tmp_path, policy)
    m, tags = result.metrics, result.tags
    assert m["mismatched_requests"] > 0, m
    assert tags["serve_outputs"] == "mismatch" and tags["serve_outputs_mismatch"] == "true"
    wrong = [r["first_mismatch"] for r in rows if r["first_mismatch"] is not None]
    assert len(wrong) == m["mismatched_requests"]
    assert m["first_mismatch_position"] == min(wrong)
    # the caveat the page shows beside a mismatching run's figures
    from fxtrack import metrics

    assert "serve_outputs_mismatch" in {c.tag for c in metrics.caveats("serve")}


FRAMEWORKS = [pytest.param("torch", id="torch")] + [
    pytest.param(fw, id=fw, marks=pytest.mark.slow) for fw in ("jax", "tensorflow", "keras")]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_frameworks_real_serve_path_matches_for_both_policies(framework, tmp_path):
    """The seeded weights, through ``python -m fxtrack``: every completed request checked, none
    mismatched, static and continuous."""
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip(framework)
    from conftest import run_fxtrack, seed_peak_cache

    env = seed_peak_cache(tmp_path / "cache")
    for policy in ("static", "continuous"):
        out = tmp_path / policy
        out.mkdir()
        proc = run_fxtrack(out, "scenario=serve", f"framework={framework}", "model=llama",
                           "size=tiny", "hardware=cpu", f"scenario.batching={policy}",
                           "scenario.rate=20", "scenario.length_dist=lognormal",
                           "scenario.num_requests=8", "scenario.prompt_len=8",
                           "scenario.new_tokens=4", "scenario.max_batch=2", "warmup_steps=1",
                           env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
        m, tags = run.data.metrics, run.data.tags
        assert m["serve_output_checked_requests"] == m["serve_percentile_requests"] == 8, policy
        assert m["mismatched_requests"] == 0, policy
        assert tags["fxtrack.serve_outputs"] == "match", policy
