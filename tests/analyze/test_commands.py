"""Next commands as data, flag by flag: what reproduces a capture for each verb, the command line and the Python call
it is said as, the launch skip of a deep dive, and each branch of the escalation plan.

The base report is a real H200 run (batch 1, device graphs on, 64 decode steps, CUPTI) whose workload the
test changes one field at a time."""

from __future__ import annotations

from pathlib import Path

import msgspec

from max_profile.analyze.commands import (
    DEEP_DIVE_STEPS_IN,
    for_model,
    kernel_command,
    launch_skip_for,
    next_command,
    shell,
    workload_of,
)
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import (
    Command,
    Environment,
    Finding,
    KernelAnalysis,
    KernelBreakdown,
    Report,
    Unavailable,
    Workload,
)
from max_profile.model.command_text import cli, python, say
from max_profile.render.verdict_text import no_next_reason

from ..builders import built_report, serve_summary

B1 = Path(__file__).parents[1] / "data" / "gpu" / "h200_llama5b_every_verb" / "run_b1_raw.json.gz"


def base() -> Report:
    return built_report(B1)


def with_workload(r: Report, **fields: object) -> Report:
    w = r.capture.workload or Workload()
    return msgspec.structs.replace(
        r, capture=msgspec.structs.replace(r.capture, workload=msgspec.structs.replace(w, **fields))
    )


def test_the_workload_from_the_capture_else_its_steps() -> None:
    r = msgspec.structs.replace(base(), capture=msgspec.structs.replace(base().capture, workload=None))
    decode = [s for s in r.steps if s.phase == "decode" and s.batch_size > 0]
    prefill = [s for s in r.steps if s.phase in ("prefill", "mixed") and s.batch_size > 0]
    w = workload_of(r)
    assert w.batch_size == 1
    assert w.prompt_tokens == round(sum(s.input_tokens for s in prefill) / sum(s.batch_size for s in prefill))
    overlap = "Overlap" in r.capture.target
    assert w.max_new_tokens == (len(decode) if overlap else len(decode) + 1)
    plain = msgspec.structs.replace(r, capture=msgspec.structs.replace(r.capture, target="TextGenerationPipeline"))
    assert workload_of(plain).max_new_tokens == len(decode) + 1  # the plain pipeline makes the first token in prefill
    said = with_workload(r, batch_size=4, prompt_tokens=9, max_new_tokens=7)
    assert (workload_of(said).batch_size, workload_of(said).prompt_tokens, workload_of(said).max_new_tokens) == (
        4,
        9,
        7,
    )
    served = msgspec.structs.replace(said, serve=serve_summary())
    assert workload_of(served) == said.capture.workload  # a server's steps say nothing of one generation
    assert workload_of(msgspec.structs.replace(r, steps=[])) == Workload()


def test_each_verb_reproduces_what_it_takes() -> None:
    r = with_workload(
        base(),
        batch_size=8,
        prompt="hi there",
        max_new_tokens=32,
        max_length=512,
        quantization_encoding="bfloat16",
        custom_architectures=["custom_archs/llama_custom"],
    )
    path = r.capture.model_path
    run = for_model(r, "run", kernels="off")
    assert run.args == {
        "model_path": path,
        "devices": "gpu",
        "batch_size": 8,
        "prompt": "hi there",
        "max_new_tokens": 32,
        "max_length": 512,
        "quantization_encoding": "bfloat16",
        "custom_architectures": ["custom_archs/llama_custom"],
        "device_graph_capture": True,
        "kernels": "off",
    }
    kernel = for_model(r, "kernel", positional=("gemv",))
    assert "device_graph_capture" not in kernel.args and kernel.args["batch_size"] == 8  # ncu runs its own way
    startup = for_model(r, "startup")
    assert startup.args == {"model_path": path, "devices": "gpu"}  # no generation: the load only
    serve = for_model(r, "serve")
    assert serve.args == {
        "model_path": path,
        "devices": "gpu",
        "custom_architectures": ["custom_archs/llama_custom"],
        "max_tokens": 32,
    }
    default_tokens = for_model(with_workload(r, max_new_tokens=64), "serve")
    assert "max_tokens" not in default_tokens.args  # serve's own default
    one = for_model(with_workload(r, batch_size=1), "run")
    assert "batch_size" not in one.args
    cpu = msgspec.structs.replace(r, capture=msgspec.structs.replace(r.capture, devices="cpu"))
    assert "device_graph_capture" not in for_model(cpu, "run").args  # no device graphs on a CPU
    unsaid = msgspec.structs.replace(r, capture=msgspec.structs.replace(r.capture, device_graph_capture=None))
    assert "device_graph_capture" not in for_model(unsaid, "kernels").args  # left to MAX, as the capture did
    no_path = msgspec.structs.replace(r, capture=msgspec.structs.replace(r.capture, model_path=None, devices=None))
    # a capture that names no model: no placeholder argument, a comment that asks for it
    unknown = for_model(no_path, "startup", comment="why")
    assert unknown.args == {} and unknown.comment == "add --model-path DIR: the capture does not name its model; why"
    assert "MODEL_PATH" not in cli(for_model(no_path, "run")) and "# add --model-path DIR" in cli(
        for_model(no_path, "run")
    )
    override = for_model(r, "run", batch_size=2, comment="why")
    assert override.args["batch_size"] == 2 and override.comment == "why"


def test_serve_commands_keep_the_sweep() -> None:
    from ..analyze.test_diff import _level

    r = msgspec.structs.replace(base(), load_levels=[_level(1, 1.0, None, None), _level(4, 1.0, None, None)])
    assert for_model(r, "serve").args["concurrency"] == "1,4"
    single = msgspec.structs.replace(base(), window_load=_level(16, 1.0, None, None))
    assert for_model(single, "serve").args["concurrency"] == "16"
    assert (
        "concurrency"
        not in for_model(msgspec.structs.replace(base(), window_load=_level(1, 1.0, None, None)), "serve").args
    )


def test_the_command_line() -> None:
    cmd = Command(
        verb="run",
        args={
            "model_path": "/m x",
            "devices": "gpu",
            "device_graph_capture": False,
            "x_y": True,
            "n": 3,
            "custom_architectures": ["a", "b c"],
        },
        positional=[],
        comment="note",
    )
    assert cli(cmd) == (
        "max-profile run --model-path '/m x' --devices gpu --no-device-graph-capture --x-y --n 3 "
        "--custom-architectures a --custom-architectures 'b c'   # note"
    )
    assert cli(Command(verb="kernel", args={"launches": 3}, positional=["gemv.*k"])) == (
        "max-profile kernel 'gemv.*k' --launches 3"
    )
    assert cli(shell("py-spy record -- x", comment="host")) == "py-spy record -- x   # host"
    assert say(shell("a"), "python") == "a" and say(shell("a"), "cli") == "a"


def test_the_python_call() -> None:
    run = Command(verb="run", args={"model_path": "m", "devices": "gpu", "kernels": "off", "batch_size": 2})
    assert python(run) == (
        "with max_profile.profile(pipeline, kernels='off', model_path='m', devices='gpu') as prof: ...  "
        "(as before: batch_size=2)"
    )
    assert python(Command(verb="run", args={"model_path": "m"})) == (
        "with max_profile.profile(pipeline, kernels='auto', model_path='m') as prof: ..."
    )
    kernels = Command(verb="kernels", args={"model_path": "m", "backend": "cupti"}, comment="c")
    assert python(kernels) == "with max_profile.profile(pipeline, kernels='cupti', model_path='m') as prof: ...   # c"
    nvtx = python(Command(verb="run", args={"model_path": "m", "devices": "cpu", "kernels": "nvtx-log"}))
    assert nvtx.startswith("max_profile.restart_with_op_ranges('cpu')  # first thing in the script, before MAX loads")
    assert nvtx.endswith(
        "then: with max_profile.profile(pipeline, kernels='nvtx-log', model_path='m', devices='cpu') as prof: ..."
    )
    assert python(Command(verb="run", args={"kernels": "nvtx-log"})).startswith(
        "max_profile.restart_with_op_ranges('cpu')"
    )
    assert "kernels='ops'" in python(Command(verb="kernels", args={"backend": "ops"}))
    nsys = python(Command(verb="kernels", args={"model_path": "m", "backend": "nsys"}))
    assert nsys == (
        "from max_profile.nsys_run import NsysRun, profile_generation_with_nsys; raw = "
        "profile_generation_with_nsys(NsysRun(model_path='m'), print)"
    )
    kernel = python(Command(verb="kernel", args={"model_path": "m", "set": "full", "launches": 3}, positional=["g"]))
    assert kernel == (
        "from max_profile.ncu_run import KernelRun, profile_kernel; raw = profile_kernel(KernelRun(name='g', "
        "model_path='m', launches=3), print)"
    )
    assert "name='NAME'" in python(Command(verb="kernel", args={}))
    serve = python(Command(verb="serve", args={"model_path": "m", "duration": 5}))
    assert serve == (
        "from max_profile.serve import ServePlan, free_port, run_serve_capture; raw = run_serve_capture(ServePlan("
        "model_path='m', duration_s=5, port=free_port(), metrics_port=free_port()), confirm=True)"
    )  # the command's own duration (a duration_s given twice was a SyntaxError)
    assert "model_path='m', duration_s=10, port=free_port()" in python(Command(verb="serve", args={"model_path": "m"}))
    other = Command(verb="startup", args={"model_path": "m"})
    assert python(other) == cli(other) == "max-profile startup --model-path m"
    assert say(other, "python") == say(other, "cli")


def test_a_deep_dive_lands_in_its_phase() -> None:
    r = base()
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    decode = next(p for p in k.phases if p.phase == "decode")
    row = decode.top_kernels[0]
    assert row.launches_before is not None
    per_step = row.count / decode.steps
    assert launch_skip_for(r, row.name, "decode") == row.launches_before + int(per_step * DEEP_DIVE_STEPS_IN)
    prefill = next(p for p in k.phases if p.phase == "prefill")
    top = prefill.top_kernels[0]
    assert launch_skip_for(r, top.name, "prefill") == top.launches_before
    assert launch_skip_for(r, row.name, None) is None
    assert launch_skip_for(r, "no such kernel", "decode") is None
    assert launch_skip_for(msgspec.structs.replace(r, kernels=None), row.name, "decode") is None
    unordered = msgspec.structs.replace(
        k,
        phases=[
            msgspec.structs.replace(
                p, top_kernels=[msgspec.structs.replace(x, launches_before=None) for x in p.top_kernels]
            )
            for p in k.phases
        ],
    )
    assert launch_skip_for(msgspec.structs.replace(r, kernels=unordered), row.name, "decode") is None
    cmd = kernel_command(r, row.name, "decode")
    assert cmd.verb == "kernel" and cmd.args["launches"] == 3 and cmd.args["set"] == "full"
    assert cmd.args["launch_skip"] == launch_skip_for(r, row.name, "decode") and cmd.comment == "decode launches"
    assert kernel_command(r, row.name).comment is None and "launch_skip" not in kernel_command(r, row.name).args
    # one decode step only: no steps to skip into
    one = msgspec.structs.replace(
        k, phases=[msgspec.structs.replace(p, steps=1) if p.phase == "decode" else p for p in k.phases]
    )
    assert launch_skip_for(msgspec.structs.replace(r, kernels=one), row.name, "decode") == row.launches_before


def test_a_servers_deep_dive_is_a_generation_at_its_decode_batch() -> None:
    r = base()
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    serve = serve_summary()
    steps = [msgspec.structs.replace(s, batch_size=6) if s.phase == "decode" else s for s in r.steps]
    served = msgspec.structs.replace(r, serve=serve, steps=steps)
    decode = next(p for p in k.phases if p.phase == "decode")
    prefill = next(p for p in k.phases if p.phase == "prefill")
    row = decode.top_kernels[0]
    pre = next((x for x in prefill.top_kernels if x.name == row.name), None)
    per_prefill = round(pre.count / prefill.steps) if pre is not None else 0
    into = int(row.count / decode.steps * DEEP_DIVE_STEPS_IN)
    assert launch_skip_for(served, row.name, "decode") == per_prefill + into
    assert launch_skip_for(served, prefill.top_kernels[0].name, "prefill") == 0
    cmd = kernel_command(served, row.name, "decode")
    assert cmd.args["batch_size"] == 6
    assert cmd.comment == "a generation at the server's decode batch; decode launches"
    assert kernel_command(served, row.name).comment == "a generation at the server's decode batch; the first launches"


def _finding(fid: str, severity: str = "warning", command: Command | None = None) -> Finding:
    return Finding(id=fid, severity=severity, title=fid, evidence={}, confidence=0.8, command=command)  # type: ignore[arg-type]


def test_the_escalation_plan_branch_by_branch() -> None:
    r = base()

    def fs(*findings: Finding, **fields: object) -> Report:
        return msgspec.structs.replace(r, findings=list(findings), **fields)

    deep = Command(verb="kernel", args={}, positional=["k"])
    assert next_command(fs(kernel_analyses=[KernelAnalysis(kernel_name="k", launch_id=1)])) is None
    assert next_command(fs(capture=msgspec.structs.replace(r.capture, target="startup"))) is None
    assert next_command(fs(_finding("kv-cache-broken", "error", deep))) is None
    assert next_command(fs(_finding("tracer-overhead"))) == for_model(r, "run", kernels="off")
    assert next_command(fs(_finding("host-bound", command=deep))) is None
    light = Command(verb="run", args={"batch_size": 8})
    assert next_command(fs(_finding("lightly-loaded", "info", light), _finding("x", command=deep))) == light
    assert next_command(fs(_finding("lightly-loaded", "info"))) is None
    # a warning with a command first (findings are ranked), info ones are not a plan
    assert next_command(fs(_finding("a", "info", light), _finding("b", "warning", deep))) == deep
    assert next_command(fs(_finding("healthy-dense-decode", "info"))) is None
    graphs = msgspec.structs.replace(r.kernels, unreliable=True)  # type: ignore[type-var]
    hidden = next_command(fs(kernels=graphs))
    assert hidden is not None and hidden.verb == "kernels" and hidden.args["backend"] == "cupti"
    no_kernels = next_command(fs(kernels=Unavailable("not asked")))
    assert no_kernels == for_model(r, "kernels", backend="cupti")
    amd = next_command(fs(kernels=None, environment=msgspec.structs.replace(r.environment, vendor="amd")))
    assert amd is not None and amd.verb == "shell" and str(amd.args["line"]).startswith("rocprofv3 --kernel-trace")
    cpu = Environment(vendor="none", vendor_reason="test")
    assert next_command(fs(kernels=None, environment=cpu)) == for_model(
        r, "run", kernels="nvtx-log", comment="MAX's op ranges on the CPU"
    )
    host = shell("py-spy record")
    assert next_command(fs(_finding("x", "info", host), environment=cpu)) == host
    assert next_command(fs(_finding("x", "info", deep), environment=cpu)) is None
    # a dominant kernel that is not a matmul, in decode: one Nsight Compute run; a matmul or a small share: none
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    decode = next(p for p in k.phases if p.phase == "decode")
    th = Thresholds()
    norm = msgspec.structs.replace(decode.top_kernels[0], family="norm", share_pct=th.plan_suspicious_share_pct)
    swapped = msgspec.structs.replace(
        k, phases=[msgspec.structs.replace(p, top_kernels=[norm]) if p.phase == "decode" else p for p in k.phases]
    )
    assert next_command(fs(kernels=swapped)) == kernel_command(fs(kernels=swapped), norm.name, "decode")
    small = msgspec.structs.replace(norm, share_pct=th.plan_suspicious_share_pct - 0.1)
    quiet = msgspec.structs.replace(
        k, phases=[msgspec.structs.replace(p, top_kernels=[small]) if p.phase == "decode" else p for p in k.phases]
    )
    assert next_command(fs(kernels=quiet)) is None
    assert next_command(fs(kernels=swapped, environment=msgspec.structs.replace(r.environment, vendor="amd"))) is None


def test_why_there_is_no_next_measurement() -> None:
    r = base()
    assert no_next_reason(msgspec.structs.replace(r, findings=[_finding("kv-cache-broken", "error")])).startswith(
        "none until the KV-cache bug is fixed"
    )
    assert no_next_reason(msgspec.structs.replace(r, findings=[_finding("host-bound")])).startswith(
        "none: the GPU is not the bottleneck"
    )
    missing = msgspec.structs.replace(r, findings=[], kernels=Unavailable("CUPTI missing"), utilization=Unavailable(""))
    assert no_next_reason(missing) == "none here, but not everything asked for was measured: kernels: CUPTI missing"
    assert no_next_reason(msgspec.structs.replace(r, findings=[])) == "none — the question is answered at this level"


def test_the_next_measurement_as_said() -> None:
    from max_profile.analyze.commands import next_measurement

    r = base()
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    decode = next(p for p in k.phases if p.phase == "decode")
    norm = msgspec.structs.replace(decode.top_kernels[0], family="norm", share_pct=30.0)
    swapped = msgspec.structs.replace(
        r,
        findings=[],
        kernels=msgspec.structs.replace(
            k, phases=[msgspec.structs.replace(p, top_kernels=[norm]) if p.phase == "decode" else p for p in k.phases]
        ),
    )
    said = next_measurement(swapped)  # a norm at 30 % of decode: one Nsight Compute run
    assert said is not None and said.startswith("max-profile kernel ")
    assert next_measurement(swapped, Thresholds(plan_suspicious_share_pct=31.0)) is None  # the caller's threshold
    py = msgspec.structs.replace(swapped, capture=msgspec.structs.replace(swapped.capture, interface="python"))
    assert (next_measurement(py) or "").startswith("from max_profile.ncu_run import KernelRun, profile_kernel")
    assert next_measurement(msgspec.structs.replace(r, findings=[_finding("host-bound")])) is None
    gpu_ops = python(Command(verb="run", args={"model_path": "m", "devices": "gpu", "kernels": "nvtx-log"}))
    assert gpu_ops.startswith("max_profile.restart_with_op_ranges('gpu')")


def test_workloads_deep_dives_and_server_batches_at_their_edges() -> None:
    r = msgspec.structs.replace(base(), capture=msgspec.structs.replace(base().capture, workload=None))
    decode = [s for s in r.steps if s.phase == "decode"]
    idle = [msgspec.structs.replace(s, batch_size=0, index=5000 + i) for i, s in enumerate(decode)]
    assert workload_of(msgspec.structs.replace(r, steps=[*r.steps, *idle])) == workload_of(r)  # idle steps: no tokens
    two = [
        msgspec.structs.replace(s, batch_size=2, input_tokens=2 * s.input_tokens) if s.phase == "prefill" else s
        for s in r.steps
    ]
    assert workload_of(msgspec.structs.replace(r, steps=two)).prompt_tokens == workload_of(r).prompt_tokens
    assert cli(Command(verb="shell", args={})) == ""
    assert say(Command(verb="run", args={}), "python").startswith("with max_profile.profile(pipeline")
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    top = k.top_kernels[0]
    # a phase the breakdown does not have: the capture's rows, no steps to skip into
    assert launch_skip_for(r, top.name, "mixed") == top.launches_before
    # several prefill steps: a prefill deep dive starts at the phase's first launch, not steps into it
    pre = next(p for p in k.phases if p.phase == "prefill")
    prow = pre.top_kernels[0]
    many = msgspec.structs.replace(
        k, phases=[msgspec.structs.replace(p, steps=3) if p.phase == "prefill" else p for p in k.phases]
    )
    assert launch_skip_for(msgspec.structs.replace(r, kernels=many), prow.name, "prefill") == prow.launches_before
    dec = next(p for p in k.phases if p.phase == "decode")
    drow = dec.top_kernels[0]
    two_steps = msgspec.structs.replace(
        k, phases=[msgspec.structs.replace(p, steps=2) if p.phase == "decode" else p for p in k.phases]
    )
    assert launch_skip_for(msgspec.structs.replace(r, kernels=two_steps), drow.name, "decode") == (
        drow.launches_before + int(drow.count / 2 * 1)  # one step in: the first is the only one before the last
    )
    missing = kernel_command(r, "no_such_kernel", "decode")
    assert missing.comment is None and "launch_skip" not in missing.args


def _served(decode_batches: list[int], prefill_steps: int = 1) -> Report:
    r = base()
    decode = [s for s in r.steps if s.phase == "decode"][: len(decode_batches)]
    prefill = next(s for s in r.steps if s.phase == "prefill")
    steps = [msgspec.structs.replace(prefill, index=i, batch_size=1) for i in range(prefill_steps)]
    steps += [msgspec.structs.replace(s, batch_size=b) for s, b in zip(decode, decode_batches, strict=True)]
    return msgspec.structs.replace(r, serve=serve_summary(), steps=steps)


def test_a_servers_deep_dive_batch_is_its_median_decode_batch() -> None:
    name = base().kernels.top_kernels[0].name  # type: ignore[union-attr]
    assert kernel_command(_served([2] * 9), name).args["batch_size"] == 2
    assert "batch_size" not in kernel_command(_served([1] * 9), name).args  # batch 1: the run's default
    assert "batch_size" not in kernel_command(_served([1] * 5 + [6] * 4), name).args  # median 1
    assert kernel_command(_served([0] * 5 + [6] * 4), name).args["batch_size"] == 6  # idle steps are no batch
    assert kernel_command(_served([6] * 9, prefill_steps=20), name).args["batch_size"] == 6  # prefill is no decode
    assert "batch_size" not in kernel_command(_served([]), name).args  # no decode step: no batch to keep


def test_a_servers_deep_dive_skips_a_prefill_steps_launches() -> None:
    r = _served([6] * 64)
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    dec = next(p for p in k.phases if p.phase == "decode")
    pre = next(p for p in k.phases if p.phase == "prefill")
    both = next(x for x in dec.top_kernels if any(y.name == x.name for y in pre.top_kernels))
    in_prefill = next(y for y in pre.top_kernels if y.name == both.name)
    two = msgspec.structs.replace(
        k, phases=[msgspec.structs.replace(p, steps=2) if p.phase == "prefill" else p for p in k.phases]
    )
    got = launch_skip_for(msgspec.structs.replace(r, kernels=two), both.name, "decode")
    assert got == round(in_prefill.count / 2) + int(both.count / dec.steps * DEEP_DIVE_STEPS_IN)


def test_the_escalation_plan_at_its_edges() -> None:
    r = base()

    def fs(*findings: Finding, **fields: object) -> Report:
        return msgspec.structs.replace(r, findings=list(findings), **fields)

    deep = Command(verb="kernel", args={}, positional=["k"])
    light = Command(verb="run", args={"batch_size": 8})
    # the lightly-loaded finding's own command, not the first finding's that has one
    assert next_command(fs(_finding("x", "info", deep), _finding("lightly-loaded", "info", light))) == light
    served = fs(_finding("tracer-overhead"), serve=serve_summary())
    util = next_command(served)
    assert util is not None and util.verb == "serve" and util.args["mode"] == "utilization"
    assert util.comment == "then --mode nsys for kernels with timing kept"
    for vendor, mode in (("nvidia", "nsys"), ("amd", "rocprof"), ("intel", "kernels")):
        env = msgspec.structs.replace(r.environment, vendor=vendor)
        cmd = next_command(fs(kernels=None, serve=serve_summary(), environment=env))
        assert cmd is not None and cmd.args["mode"] == mode
    k = r.kernels
    assert isinstance(k, KernelBreakdown)
    decode = next(p for p in k.phases if p.phase == "decode")
    th = Thresholds()
    rows = [msgspec.structs.replace(x, family="gemv", share_pct=50.0) for x in decode.top_kernels[:3]]
    norm4 = msgspec.structs.replace(decode.top_kernels[3], family="norm", share_pct=th.plan_suspicious_share_pct)
    fourth = msgspec.structs.replace(
        k,
        phases=[msgspec.structs.replace(p, top_kernels=[*rows, norm4]) if p.phase == "decode" else p for p in k.phases],
    )
    assert next_command(fs(kernels=fourth)) is None  # only the top three kernels are looked at
    flat = msgspec.structs.replace(
        k,
        phases=[p for p in k.phases if p.phase != "decode"],
        top_kernels=[
            msgspec.structs.replace(
                k.top_kernels[0], family="norm", share_pct=th.plan_suspicious_share_pct, launches_before=5
            )
        ],
    )
    cmd = next_command(fs(kernels=flat))
    assert cmd is not None and cmd.comment is None and "launch_skip" not in cmd.args  # no decode phase to land in
