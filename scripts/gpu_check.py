"""（维护者用）在有 GPU 的机器上把本库的 CUDA / NCCL / Triton-GPU 路径各跑一遍，写出一份 JSON 报告。

检查项（每项单独 try/except，打印一行 ``PASS|FAIL|SKIP  名字  数值``）：

1. model_cuda_vs_cpu：随机的小 DecoderOnlyLM（GQA + RoPE）与随书的唐诗检查点，cuda float32 对 CPU 的
   logits 最大绝对差，以及贪心生成 32 个词元是否逐个相同；
2. no_host_sync：默认的取值检查开关（``CHECK_VALUES=None``，只在 CPU 上查）下，cuda 上的前向在
   ``torch.cuda.set_sync_debug_mode("error")`` 里不报错；再报告打开开关后是否确实会同步（预期会）；
3. train_cuda：``LMTrainer`` 在 cuda 与 CPU 上从同一份权重训几步，损失逐步一致且在下降；
4. triton_compiled：cuda 上内核是编译的（不是解释器），每个内核对 PyTorch 参照的最大误差，以及
   ``kernel_error_table(device=...)`` 的相对误差（GPU 上用到 ``tl.dot`` 的内核走 TF32，按 5e-3 判）；CPU 上在 Triton 解释器（``TRITON_INTERPRET=1``）里跑同样的小形状；
5. nccl_launch：``parallel.launch(world_size=1, device="cuda")``（nccl）做一次 all_reduce；
6. engine_compiled_cuda：服务引擎 ``decode_step="eager"`` 与 ``"compiled"`` 的输出与贪心 ``generate`` 相同
   （CPU 上用 ``"fixed"`` 代替 ``"compiled"``，不编译）；
7. sdpa_bf16：快速路径注意力（``fast_scaled_dot_product_attention``）bfloat16 对 float32 显式路径的最大误差；
8. hf_llama_cuda：transformers 按配置随机生成的小 LlamaForCausalLM，``save_pretrained`` 后用 ``load_hf`` 读，
   两边 logits 的最大差与贪心 16 个词元是否相同（不下载任何东西）。

运行（在仓库根目录，整个约几分钟）::

    PYTHONPATH=. python3 scripts/gpu_check.py --out gpu_check.json
    PYTHONPATH=. python3 scripts/gpu_check.py --device cpu --out /tmp/gpu_check_cpu.json   # 只检查脚本本身

``--device cpu`` 时只有 CUDA 才有意义的部分报 ``SKIP (no cuda)``，其余在 CPU 上跑。任一项 FAIL 时退出码为 1。
CI 从不运行它，库与测试也不依赖它：它只在维护者拿到 GPU 时手动跑一次。
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # 从源码树运行（与 PYTHONPATH=. 相同）


class Skip(Exception):
    """这一项在这台机器上不适用（如没有 CUDA）。"""


def small_config(**overrides):
    from tformer_lib.lm import LMConfig

    base = dict(vocab_size=97, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128, max_len=64,
                positional="rope", norm="rms", activation="swiglu", qkv_bias=False, out_bias=False, ffn_bias=False)
    return LMConfig(**{**base, **overrides})


def seeded_lm(seed: int = 0, **overrides):
    from tformer_lib.lm import make_lm

    torch.manual_seed(seed)
    return make_lm(small_config(**overrides)).eval()


def need_cuda(device: str) -> None:
    if device != "cuda":
        raise Skip("no cuda")


def compare_on_devices(model, prompt: torch.Tensor, device: str, new_tokens: int) -> dict:
    """同一份权重在 ``device`` 与 CPU 上：logits 最大差，贪心生成的词元有几个相同。"""
    from tformer_lib.lm import generate

    cpu, dev = copy.deepcopy(model).cpu().eval(), copy.deepcopy(model).to(device).eval()
    with torch.no_grad():
        diff = (dev(prompt.to(device)).cpu() - cpu(prompt)).abs().max().item()
    a = generate(dev, prompt, new_tokens, method="greedy").cpu()
    b = generate(cpu, prompt, new_tokens, method="greedy")
    return {"max_abs_logit_diff": diff, "tokens_agree": int((a == b).sum()), "tokens": b.numel()}


def check_model_cuda_vs_cpu(device: str) -> dict:
    from tformer_lib.lm import load_poem_model
    from tformer_lib.specials import BOS

    g = torch.Generator().manual_seed(1)
    random_lm = compare_on_devices(seeded_lm(), torch.randint(4, 97, (2, 8), generator=g), device, 32)
    poem, tokenizer, _ = load_poem_model()
    prompt = torch.tensor([[BOS, *tokenizer.encode("床前明月光，")]])
    poem_lm = compare_on_devices(poem, prompt, device, 32)
    ok = all(r["max_abs_logit_diff"] < 1e-4 and r["tokens_agree"] == r["tokens"] for r in (random_lm, poem_lm))
    return {"ok": ok, "random_gqa_rope": random_lm, "poem_checkpoint": poem_lm}


def check_no_host_sync(device: str) -> dict:
    need_cuda(device)
    from tformer_lib import _checks
    from tformer_lib.lm import generate

    model = seeded_lm().to(device)
    tokens = torch.randint(4, 97, (2, 16), device=device)
    saved = _checks.CHECK_VALUES
    result = {"env_TFORMER_CHECK_VALUES": os.environ.get("TFORMER_CHECK_VALUES")}
    try:
        for name, switch in (("default_none", None), ("switch_on", True)):
            _checks.CHECK_VALUES = switch
            with torch.no_grad():
                model(tokens)  # 预热：第一次调用的初始化不算
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    model(tokens)
                    result[f"{name}_syncs"] = False
                except RuntimeError as exc:
                    result[f"{name}_syncs"] = True
                    result[f"{name}_error"] = str(exc).splitlines()[0][:200]
                finally:
                    torch.cuda.set_sync_debug_mode(0)
        _checks.CHECK_VALUES = None  # 信息：默认设置下贪心 generate 整个循环是否同步（不影响结论）
        torch.cuda.set_sync_debug_mode("error")
        try:
            generate(model, tokens, 4, method="greedy")
            result["generate_greedy_syncs"] = False
        except RuntimeError as exc:
            result["generate_greedy_syncs"] = str(exc).splitlines()[0][:200]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    finally:
        _checks.CHECK_VALUES = saved
    result["ok"] = result["default_none_syncs"] is False
    return result


def train_losses(model, blocks: torch.Tensor, steps: int) -> list[float]:
    from tformer_lib.lm import LMTrainer

    trainer = LMTrainer(model, blocks, batch_size=8, lr=3e-3, warmup=1, total_steps=steps, progress=False, seed=0)
    return [trainer.train_step() for _ in range(steps)]


def check_train_cuda(device: str) -> dict:
    steps = 8
    g = torch.Generator().manual_seed(2)
    starts = torch.randint(0, 90, (32, 1), generator=g)
    blocks = 4 + (starts + torch.arange(33)) % 93  # (32, 33)：可学的规律（每个词元 +1），id ≥ 4 不碰特殊词元
    model = seeded_lm(3)
    dev = train_losses(copy.deepcopy(model).to(device), blocks, steps)
    cpu = train_losses(copy.deepcopy(model), blocks, steps)
    rel = [abs(a - b) / abs(b) for a, b in zip(dev, cpu)]
    ok = rel[0] < 1e-4 and max(rel) < 1e-3 and dev[-1] < dev[0]
    return {"ok": ok, "first_step_rel_diff": rel[0], "max_rel_diff": max(rel), "loss_first": dev[0],
            "loss_last": dev[-1], "losses_dev": dev, "losses_cpu": cpu}


def flash_bf16_error(device: str) -> float | None:
    """bfloat16 输入的 FlashAttention 内核对 float32 SDPA 的最大绝对误差（形状同 kernel_error_table 的那一行）；
    只在 GPU 上算：解释器里的 tl.dot 算不对 bfloat16。"""
    if device != "cuda":
        return None
    import torch.nn.functional as F

    from tformer_lib import kernels as K

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, 37, 20, generator=g).to(device) for _ in range(3))
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = K.flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True, block_m=16, block_n=16)
    return (out.float() - sdpa).abs().max().item()


def check_triton_compiled(device: str) -> dict:
    from tformer_lib.kernels import _runtime, add, decoding, flash_forward, softmax, tiled_matmul

    kernels = (add._add_kernel, softmax.softmax_kernel, tiled_matmul._matmul_kernel,
               flash_forward._flash_forward_kernel, decoding._split_kernel, decoding._combine_kernel)
    interpreted = [_runtime.is_interpreted(k) for k in kernels]
    result = {"mode": "interpreter (TRITON_INTERPRET=1)" if any(interpreted) else "compiled",
              "env_TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"), "interpreted": interpreted}
    from tformer_lib.kernels import kernel_error_table

    # GPU 上 float32 的 tl.dot 默认走 TF32（尾数 10 位）：用到它的内核按结果大小的 5e-3 判，其余按 float32 的 1e-5
    tf32_kernels = {"matmul", "naive_attention", "flash_attention"} if device == "cuda" else set()
    rows = kernel_error_table(device=device)
    result["max_abs_error"] = {f"{r['kernel']}[{i}]": r["max_abs_error"] for i, r in enumerate(rows)}
    relative = {f"{r['kernel']}[{i}]": r["max_abs_error"] / r["max_abs_reference"] for i, r in enumerate(rows)}
    result["kernel_error_table_relative"] = relative
    fp32_ok = all(rel < (5e-3 if name.split("[")[0] in tf32_kernels else 1e-5) for name, rel in relative.items())
    bf16 = flash_bf16_error(device)
    if bf16 is not None:
        result["flash_attention_bf16_max_abs_error"] = bf16
    bf16_ok = bf16 is None or bf16 < 5e-2
    mode_ok = (not any(interpreted)) if device == "cuda" else all(interpreted)
    result["ok"] = fp32_ok and bf16_ok and mode_ok
    return result


def _all_reduce_worker(rank: int, world_size: int) -> dict:
    """launch 的 worker（顶层函数：spawn 要按名字导入它）。"""
    import torch.distributed as dist

    t = torch.full((4,), float(rank + 1), device=f"cuda:{torch.cuda.current_device()}")
    dist.all_reduce(t)
    return {"backend": dist.get_backend(), "value": t.cpu().tolist(), "device": str(t.device)}


def check_nccl_launch(device: str) -> dict:
    need_cuda(device)
    from tformer_lib.parallel.launch import backend_for, launch

    start = time.perf_counter()
    (out,) = launch(_all_reduce_worker, world_size=1, device="cuda", timeout=120)
    return {"ok": out["backend"] == "nccl" and out["value"] == [1.0] * 4, "backend_for_cuda": backend_for("cuda"),
            **out, "seconds": time.perf_counter() - start,
            "note": "world_size=1 only: NCCL cannot run 2 ranks on one GPU"}


def check_fused_loss_cuda(device: str) -> dict:
    """输出层与交叉熵融合（linear_cross_entropy）在设备上：损失与两个梯度对照同一设备上的 F.cross_entropy。"""
    import torch.nn.functional as F

    from tformer_lib.lm import linear_cross_entropy

    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(300, 64, generator=g).to(device).requires_grad_()
    weight = (torch.randn(1000, 64, generator=g) / 8).to(device).requires_grad_()
    targets = torch.randint(1, 1000, (300,), generator=g).to(device)
    targets[::5] = 0  # PAD：不计损失
    ref = F.cross_entropy(hidden @ weight.T, targets, ignore_index=0)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, targets, chunk_size=64)
    grads = torch.autograd.grad(loss, (hidden, weight))
    rel = [float((a - b).norm() / b.norm()) for a, b in zip(grads, ref_grads)]
    loss_rel = abs(loss.item() - ref.item()) / abs(ref.item())
    return {"ok": loss_rel < 1e-5 and max(rel) < 1e-4, "loss_rel_diff": loss_rel, "grad_rel_diff": rel}


def check_engine_compiled_cuda(device: str) -> dict:
    from tformer_lib.lm import generate
    from tformer_lib.serving.engine import Engine, Request

    model = seeded_lm(4).to(device)
    g = torch.Generator().manual_seed(5)
    jobs = [(torch.randint(4, 97, (n,), generator=g).tolist(), m) for n, m in ((5, 12), (7, 8), (6, 10))]
    want = [generate(model, torch.tensor(p, device=device), m, method="greedy").tolist() for p, m in jobs]
    modes = ("eager", "compiled") if device == "cuda" else ("eager", "fixed")
    result: dict = {"modes": list(modes)}
    for mode in modes:
        start = time.perf_counter()
        requests = [Request(p, m) for p, m in jobs]
        Engine(model, max_batch=4, decode_step=mode).run(requests)
        result[f"{mode}_identical"] = [r.output for r in requests] == want
        result[f"{mode}_seconds"] = round(time.perf_counter() - start, 2)
    result["ok"] = all(result[f"{m}_identical"] for m in modes)
    return result


def check_sdpa_bf16(device: str) -> dict:
    from tformer_lib.parts.attention import fast_scaled_dot_product_attention, scaled_dot_product_attention

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 4, 96, 64, generator=g).to(device) for _ in range(3))
    mask = torch.ones(96, 96, dtype=torch.bool, device=device).tril()[None, None].repeat(2, 1, 1, 1)  # (2, 1, T, T)
    mask[1, :, :, 50:] = False  # 第二条序列只有前 50 个键（填充）
    mask[1, :, 5] = False  # 还有一整行被屏蔽：输出应为 0
    result = {}
    for name, m in (("no_mask", None), ("causal_padding_mask", mask)):
        ref, _ = scaled_dot_product_attention(q, k, v, m)
        out = fast_scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), m)
        result[f"{name}_max_abs_err"] = (out.float() - ref).abs().max().item()
        result[f"{name}_dtype"] = str(out.dtype)
    result["masked_row_zero"] = bool((out[1, :, 5] == 0).all())
    result["ok"] = max(result["no_mask_max_abs_err"], result["causal_padding_mask_max_abs_err"]) < 3e-2 \
        and result["masked_row_zero"]
    return result


def check_hf_llama_cuda(device: str) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from tformer_lib.lm import generate, load_hf

    hf_logging.disable_progress_bar()
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, attn_implementation="sdpa")
    torch.manual_seed(7)
    theirs = LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours, _ = load_hf(tmp)
    ours, theirs = ours.to(device).eval(), theirs.to(device)
    prompt = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(8)).to(device)
    with torch.no_grad():
        diff = (ours(prompt) - theirs(input_ids=prompt).logits).abs().max().item()
    mine = generate(ours, prompt, 16, method="greedy")
    hf_out = theirs.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                             min_new_tokens=16, do_sample=False, suppress_tokens=[0, 1], pad_token_id=0,
                             eos_token_id=None)[:, 8:]
    agree = int((mine == hf_out).sum())
    return {"ok": diff < 1e-4 and agree == mine.numel(), "max_abs_logit_diff": diff, "tokens_agree": agree,
            "tokens": mine.numel()}


CHECKS = [check_model_cuda_vs_cpu, check_no_host_sync, check_train_cuda, check_fused_loss_cuda, check_triton_compiled,
          check_nccl_launch, check_engine_compiled_cuda, check_sdpa_bf16, check_hf_llama_cuda]


def short(numbers: dict) -> str:
    """一行里放得下的数：标量与短列表，浮点数保留 3 位有效数字。"""
    parts = []
    for key, value in numbers.items():
        if isinstance(value, float):
            value = f"{value:.3g}"
        elif isinstance(value, dict):
            value = "{" + short(value) + "}"
        elif isinstance(value, list) and len(value) > 6:  # 长列表只进 JSON
            continue
        parts.append(f"{key}={value}")
    return " ".join(str(p) for p in parts)


def run_check(fn, device: str) -> dict:
    name = fn.__name__.removeprefix("check_")
    start = time.perf_counter()
    record = {"name": name, "status": "PASS", "numbers": {}, "error": None}
    try:
        numbers = fn(device)
        ok = numbers.pop("ok")
        record["numbers"] = numbers
        record["status"] = "PASS" if ok else "FAIL"
    except Skip as exc:
        record["status"], record["error"] = "SKIP", f"skipped ({exc})"
    except Exception as exc:  # noqa: BLE001 — 一项出错不影响别的项
        lines = traceback.format_exc().strip().splitlines()
        record["status"], record["error"] = "FAIL", f"{type(exc).__name__}: {exc}\n" + "\n".join(lines[-8:])
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    record["seconds"] = round(time.perf_counter() - start, 2)
    detail = short(record["numbers"]) if record["status"] != "SKIP" else record["error"]
    if record["status"] == "FAIL" and record["error"]:
        detail += "  error: " + record["error"].splitlines()[0][:200]
    print(f"{record['status']:<5} {name:<22} {detail}  ({record['seconds']}s)", flush=True)
    return record


def machine(device: str) -> dict:
    def version(module: str):
        try:
            return __import__(module).__version__
        except Exception:  # noqa: BLE001
            return None

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": version("triton"),
            "transformers": version("transformers"),
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="gpu_check.json", help="JSON 报告的路径")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="只跑这几项（名字去掉 check_ 前缀，如 triton_compiled）")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda，但 torch.cuda.is_available() 为 False")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # 内核模块导入之前：CPU 上只能解释执行
    chosen = [fn for fn in CHECKS if args.only is None or fn.__name__.removeprefix("check_") in args.only]
    if not chosen:
        parser.error(f"--only 里没有认得的名字：{args.only}；可选 {[fn.__name__.removeprefix('check_') for fn in CHECKS]}")
    records = [run_check(fn, args.device) for fn in chosen]
    report = {"machine": machine(args.device), "checks": records}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=2), encoding="utf-8")
    failed = [r["name"] for r in records if r["status"] == "FAIL"]
    print(f"{len(records) - len(failed)}/{len(records)} not failed; report: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
