"""A Hugging Face Llama under FSDPStrategy's tensor parallelism (``tp_plan='auto'`` reads the
model's own ``_tp_plan``): on 2 real gloo ranks it trains exactly as one process does on the
same global batch, its projections are really split, and its sharded checkpoint exports to
a safetensors file (and a full one) that ``transformers`` loads back into ``LlamaForCausalLM``.

The model is built from a tiny local ``LlamaConfig``: nothing is downloaded. ``transformers``
is a test-only oracle (the ``test`` extra); without it the module is skipped.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Shard

transformers = pytest.importorskip(
    "transformers", reason="transformers (the test extra) builds the Hugging Face Llama"
)

from shardwise.checkpoint.convert import convert_checkpoint  # noqa: E402
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy  # noqa: E402
from tests.distributed import run_distributed  # noqa: E402

VOCAB, SEQ, BATCH, STEPS = 64, 16, 8, 8
OPTIM = dict(
    optimizer=dict(type="AdamW", lr=2e-3, weight_decay=0.01),
    clip_grad=dict(max_norm=1.0),
)


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: each rank holds 2 q heads, 1 kv head
        max_position_embeddings=SEQ,
        attention_dropout=0.0,
        attn_implementation="eager",
        tie_word_embeddings=False,  # the embedding is split by rows, the LM head by columns
    )


def build_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(llama_config())


def batch(step: int) -> torch.Tensor:
    """Rows counting up from a random start (mod the vocabulary): learnable in a few steps."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=torch.Generator().manual_seed(step))
    return (start + torch.arange(SEQ)) % VOCAB


PROBE = batch(1000)  # input whose logits the exported checkpoints must reproduce


def full_weights(model) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def train(strategy, model, wrapper) -> tuple[list[float], list[float]]:
    """The model's own loss on each step's global batch, this rank taking its data-parallel
    share (tensor-parallel peers read the same rows); returns every step's loss and gradient
    norm (before clipping: over every shard, on every mesh dimension)."""
    losses, norms = [], []
    share = BATCH // strategy.data_parallel_size
    rows = slice(strategy.data_parallel_rank * share, (strategy.data_parallel_rank + 1) * share)
    for step in range(STEPS):
        ids = batch(step)[rows]
        with wrapper.optim_context(model):
            loss = model(input_ids=ids, labels=ids).loss
        wrapper.update_params(loss)
        losses.append(loss.item())
        norms.append(float(wrapper.last_grad_norm))
    return losses, norms


def _train_tp(work_dir: str) -> dict:
    strategy = FSDPStrategy(
        work_dir=work_dir,
        env_kwargs=dict(randomness=dict(seed=0)),
        parallelism=dict(tp=2),
        tp_plan="auto",
    )
    model, wrapper = strategy.prepare(
        build_llama(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=STEPS)
    )
    attn = model.model.layers[0].self_attn
    split = {
        name: (
            tuple(p.to_local().shape),
            p.device_mesh.mesh_dim_names,
            p.placements[p.device_mesh.mesh_dim_names.index("tp")],
        )
        for name, p in (
            ("q_proj", attn.q_proj.weight),
            ("k_proj", attn.k_proj.weight),
            ("o_proj", attn.o_proj.weight),
            ("lm_head", model.lm_head.weight),
        )
    }
    losses, norms = train(strategy, model, wrapper)
    with torch.no_grad():
        logits = model(input_ids=PROBE).logits.detach().clone()
    strategy.save_checkpoint(f"{work_dir}/tp_sharded")
    return dict(
        losses=losses,
        norms=norms,
        weights=full_weights(model),
        logits=logits,
        split=split,
        mesh=dict(zip(strategy.mesh.mesh_dim_names, strategy.mesh.shape, strict=True)),
        data=(strategy.data_parallel_rank, strategy.data_parallel_size),
    )


def _train_single(work_dir: str) -> dict:
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    model, wrapper = strategy.prepare(
        build_llama(), optim_wrapper=OPTIM, dispatch_kwargs=dict(max_iters=STEPS)
    )
    losses, norms = train(strategy, model, wrapper)
    return dict(losses=losses, norms=norms, weights=full_weights(model))


def max_relative_error(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    return max(((got[k] - want[k]).abs().max() / want[k].abs().max()).item() for k in want)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("hf_tp")
    tp = run_distributed(_train_tp, 2, str(work_dir / "tp"), timeout=240)
    single = _train_single(str(work_dir / "single"))
    return work_dir, tp, single


def test_llama_tp2_trains_as_one_process_does(runs):
    _, tp, single = runs
    assert single["losses"][-1] < single["losses"][0] - 0.3  # it learns: a test with teeth
    assert max(single["norms"]) > OPTIM["clip_grad"]["max_norm"]  # clipping acts
    for rank in tp:
        assert rank["mesh"] == {"dp_shard": 1, "tp": 2}
        assert rank["data"] == (0, 1)  # both ranks are tensor-parallel peers on one batch
        assert rank["losses"] == pytest.approx(single["losses"], rel=1e-5)
        # the global norm, over the tp and dp_shard shards alike, on every rank
        assert rank["norms"] == pytest.approx(single["norms"], rel=1e-5)
        assert max_relative_error(rank["weights"], single["weights"]) < 1e-5


def test_llama_projections_are_split_over_the_tp_ranks(runs):
    _, tp, _ = runs
    for rank in tp:
        split = rank["split"]
        # q_proj: 4 heads of 8 → 2 per rank; k_proj: 2 kv heads → 1; o_proj by its input
        assert split["q_proj"] == ((16, 32), ("dp_shard", "tp"), Shard(0))
        assert split["k_proj"] == ((8, 32), ("dp_shard", "tp"), Shard(0))
        assert split["o_proj"] == ((32, 16), ("dp_shard", "tp"), Shard(1))
        assert split["lm_head"] == ((VOCAB // 2, 32), ("dp_shard", "tp"), Shard(0))


def _llama_with(state: dict[str, torch.Tensor]):
    model = transformers.LlamaForCausalLM(llama_config())
    model.load_state_dict(state)  # strict: every key, nothing extra
    return model.eval()


def test_llama_tp_checkpoint_exports_to_files_transformers_loads(runs, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work_dir, tp, _ = runs
    trained = tp[0]["weights"]
    sharded = work_dir / "tp" / "tp_sharded"
    assert sharded.is_dir()
    hf_dir = work_dir / "hf"  # a Hugging Face model directory: config.json, model.safetensors
    llama_config().save_pretrained(hf_dir)
    exported = convert_checkpoint(sharded, hf_dir / "model.safetensors", to="safetensors")
    full = convert_checkpoint(sharded, work_dir / "llama_full.pth", to="full", model_only=True)
    for state in (load_file(exported), torch.load(full, weights_only=True)["state_dict"]):
        assert state.keys() == trained.keys()
        assert all(torch.equal(state[k], trained[k]) for k in trained)  # bit for bit
        with torch.no_grad():
            logits = _llama_with(state)(input_ids=PROBE).logits
        # the TP model's logits on both ranks (their reductions round differently)
        for rank in tp:
            torch.testing.assert_close(logits, rank["logits"], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        want = _llama_with(trained)(input_ids=PROBE).logits
        got = _llama_with(load_file(exported))(input_ids=PROBE).logits
        pretrained = transformers.LlamaForCausalLM.from_pretrained(
            hf_dir, attn_implementation="eager"
        ).eval()
        from_dir = pretrained(input_ids=PROBE).logits
    assert torch.equal(got, want)
    assert torch.equal(from_dir, want)


def test_llama_tp_checkpoint_loads_on_one_process(runs):
    """The sharded checkpoint of the tp=2 run reshards onto an unsplit model."""
    work_dir, tp, _ = runs
    strategy = SingleDeviceStrategy(work_dir=str(work_dir / "reload"))
    model = strategy.prepare(build_llama())
    trained = tp[0]["weights"]
    assert not torch.equal(full_weights(model)["lm_head.weight"], trained["lm_head.weight"])
    strategy.load_checkpoint(work_dir / "tp" / "tp_sharded")
    loaded = full_weights(model)
    assert loaded.keys() == trained.keys()
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
