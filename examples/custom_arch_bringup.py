"""Bring up a custom architecture: preflight in seconds, then one profiled generation that shows whether
attention runs as one fused kernel and whether the KV cache is used.

    python examples/custom_arch_bringup.py [--package custom_archs/llama_unfused_attention] [--model-path DIR]

Preflight (``check_architecture``) imports the package in a child process with a timeout and checks
import drift against the installed MAX, name clashes with built-in architectures, the model's
config.json and chat template — before a load that can take minutes. Then the model is profiled
with MAX's op ranges (``kernels="nvtx-log"``; on NVIDIA GPUs ``kernels="cupti"``), and the kernel
families and findings say: fused attention present or not, decode feeding one token per sequence
(a KV cache in use) or the whole sequence again. Without --model-path a tiny random model is built
for the package's architecture.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from max_profile import check_architecture, profile, restart_with_op_ranges
from max_profile.model import KernelBreakdown
from max_profile.render.terminal import fit_to_terminal
from max_profile.runner import generate, load_model
from max_profile.tinymodel import build_tiny_llama

REPO = Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser()
ap.add_argument("--package", default=str(REPO / "custom_archs" / "llama_custom"))
ap.add_argument(
    "--architecture", default=None, help="config.json architecture for the built model (default: the package's)"
)
ap.add_argument("--model-path")
ap.add_argument(
    "--out", default="max-profile-bringup", help="where the tiny model is built when --model-path is not given"
)
ap.add_argument("--tokens", type=int, default=24)
args = ap.parse_args()

# MAX's op ranges are logged only when the NVTX library is loaded at process start: restart once (the log goes at exit)
restart_with_op_ranges("cpu")

# 1. preflight: seconds, in a child process; nothing of the package is imported here
result = check_architecture(args.package, args.model_path)
for check in result.checks:
    print(fit_to_terminal(f"{'ok' if check.ok else check.severity:8s} {check.id}: {check.message}"))
if not result.ok:
    sys.exit(f"preflight failed for {args.package}: fix the errors above before loading")
not_used = next((c for c in result.checks if c.id == "model-arch-not-custom" and not c.ok), None)
if not_used is not None:  # the built-in would run: nothing measured below would say anything about the package
    sys.exit(f"stopping: {not_used.message}; fix: {not_used.fix}")
architecture = args.architecture or result.architectures[0]

model_path = args.model_path or str(
    build_tiny_llama(Path(args.out) / f"model-{architecture}", architecture=architecture)
)
model = load_model(model_path, devices="cpu", custom_architectures=[args.package])
generate(model, ["warm up"], 4)
with profile(model.pipeline, kernels="nvtx-log", model_path=model_path, devices="cpu") as prof:
    generate(model, ["I believe the meaning of life is"], args.tokens)
report = prof.report

# 3. the two questions of a bring-up
kernels = report.kernels
if isinstance(kernels, KernelBreakdown):
    decode = next((p for p in kernels.phases if p.phase == "decode"), None)
    families = {row.family: row.share_pct for row in (decode.families if decode else kernels.families)}
    print(
        fit_to_terminal(
            f"decode kernel families (% of kernel time): {', '.join(f'{f} {v:.0f}' for f, v in families.items())}"
        )
    )
    print("fused attention kernel in decode:", "yes" if families.get("attention", 0) > 0 else "NO")
fed = [s.model_input_tokens or s.input_tokens for s in report.steps if s.phase == "decode"]
print(
    fit_to_terminal(
        f"tokens the model computed per decode step: {sorted(set(fed))} (1 per sequence = the KV cache is used)"
    )
)
for finding in report.findings:
    print(fit_to_terminal(f"[{finding.severity}] {finding.id}: {finding.title}"))
model.close()
