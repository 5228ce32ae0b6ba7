"""Profile a generation in-process: the pipeline you already build with MAX, wrapped in ``profile()``.

    python examples/profile_generation.py [--model-path DIR] [--devices cpu|gpu] [--tokens 32]

Shows: building a MAX text-generation pipeline the way ``max generate`` does (PipelineConfig +
PIPELINE_REGISTRY), running it with GenerateIterator, and what ``profile()`` gives back — a report
with steps per phase, GPU utilization (on a GPU), kernels (``kernels="auto"``: CUPTI on NVIDIA) and
findings, plus the raw capture to re-analyse later. Without --model-path a tiny random Llama is built.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from max.driver import DeviceSpec, accelerator_count
from max.pipelines import PIPELINE_REGISTRY
from max.pipelines.context import SamplingParams
from max.pipelines.lib import PipelineArgs, PipelineConfig
from max.pipelines.lib.generate import GenerateIterator
from max.pipelines.modeling.types import RequestID, TextGenerationRequest

import max_profile
from max_profile.model import StepSummary
from max_profile.render.html import render_html
from max_profile.render.terminal import fit_to_terminal

ap = argparse.ArgumentParser()
ap.add_argument("--model-path")
ap.add_argument("--devices", choices=["cpu", "gpu"], default="gpu" if accelerator_count() else "cpu")
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--out", default="max-profile-profile-generation", help="folder for what it writes (created)")
args = ap.parse_args()
Path(args.out).mkdir(parents=True, exist_ok=True)
if args.model_path is None:
    from max_profile.tinymodel import build_tiny_llama

    args.model_path = str(build_tiny_llama(Path(args.out) / "tiny-llama"))

# 1. the pipeline, as your own code builds it
devices = [DeviceSpec.accelerator(0)] if args.devices == "gpu" else [DeviceSpec.cpu()]
config = PipelineConfig.from_args(
    PipelineArgs.from_flat_kwargs(model_path=args.model_path, device_specs=devices, max_batch_size=1)
)
factory = PIPELINE_REGISTRY.retrieve_factory(config)
pipeline, tokenizer = factory.factory(), factory.tokenizer


def run(prompt: str, tokens: int) -> int:
    sampling = SamplingParams(max_new_tokens=tokens, ignore_eos=True, top_k=1)
    request = TextGenerationRequest(
        request_id=RequestID(), model_name=args.model_path, prompt=prompt, sampling_params=sampling
    )
    context = asyncio.run(tokenizer.new_context(request))
    produced = 0
    with GenerateIterator.from_contexts(pipeline, [context], caller="example") as batch:
        while not batch.done:
            produced += sum(len(t) for t in batch.step().values())
    return produced


run("warm up", 4)  # the first steps of a process include one-time work: keep them out of the profile

# 2. the profiled block
with max_profile.profile(pipeline, kernels="auto", model_path=args.model_path) as prof:
    run("I believe the meaning of life is", args.tokens)

# 3. what came back
report = prof.report
print(report)  # the same text `max-profile run` prints
summary = report.step_summary
if isinstance(summary, StepSummary):
    print(fit_to_terminal(f"TTFT {summary.ttft_ms:.2f} ms, decode {summary.decode_tokens_per_s:.1f} tokens/s"))
for finding in report.findings:
    print(fit_to_terminal(f"[{finding.severity}] {finding.id}: {finding.title}"))
prof.raw_capture.save(str(Path(args.out) / "raw.json.gz"))  # `max-profile report raw.json.gz` rebuilds the report
Path(args.out, "report.html").write_text(render_html(report))
print(fit_to_terminal(f"raw capture and HTML report in {args.out}"))
