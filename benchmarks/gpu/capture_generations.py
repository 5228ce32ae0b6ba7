"""Captures for the one-account invariant: the same model profiled in-process at batch 1 and at a large batch, with
MAX's defaults (device graphs as MAX decides, the overlap pipeline) and ``profile(kernels="auto")``'s default
recording (CUPTI, a sixteenth of the steps). One load serves both batches (one compile key: ``max_batch_size`` = the
large batch), as an app that serves both would load it.

    python benchmarks/gpu/capture_generations.py --model-path DIR --batch 48 --tokens 128 --out DIR

Writes, per batch B: ``gen_bB_raw.json.gz`` (the raw capture), ``gen_bB.json`` (the report) and ``gen_bB.txt`` (its
text), and prints each capture's decode figures as the ledger and the breakdown give them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import max_profile  # noqa: E402
from max_profile.model import KernelBreakdown, StepLedger  # noqa: E402
from max_profile.render.terminal import fit_to_terminal  # noqa: E402
from max_profile.runner import generate, load_model  # noqa: E402

PROMPT = "I believe the meaning of life is"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = load_model(args.model_path, devices=args.devices, max_batch_size=args.batch)
    print(f"loaded in {time.time() - t0:.1f} s", flush=True)
    for b in (1, args.batch):
        generate(model, [PROMPT] * b, 8)  # warm-up: compile and first-use costs outside the capture
    for b in (1, args.batch):
        with max_profile.profile(
            model.pipeline, kernels="auto", model_path=args.model_path, devices=args.devices
        ) as prof:
            generate(model, [PROMPT] * b, args.tokens)
        raw, report = prof.raw_capture, prof.report
        raw.save(str(out / f"gen_b{b}_raw.json.gz"))
        report.save(str(out / f"gen_b{b}.json"))
        (out / f"gen_b{b}.txt").write_text(str(report))
        k, lg = report.kernels, report.ledger
        if isinstance(k, KernelBreakdown) and isinstance(lg, StepLedger):
            for lp in lg.phases:
                bp = next(p for p in k.phases if p.phase == lp.phase)
                print(
                    fit_to_terminal(
                        f"batch {b} {lp.phase}: ledger {lp.steps} of {lp.steps_in_capture} steps, {lp.step_ms:.3f} ms, "
                        f"busy {lp.busy_pct:.1f} %; breakdown {bp.steps} steps, busy {bp.gpu_busy_pct}, "
                        f"{bp.kernel_ms_per_step} ms/step, {bp.kernel_us_per_token} us/token",
                        200,
                    ),
                    flush=True,
                )
        print(f"batch {b}: findings {[f.id for f in report.findings]}; next: {report.next_measurement}", flush=True)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
