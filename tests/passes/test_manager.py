"""Pass registry, pipeline specs and the pass manager's instrumentation."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pytest

import lucid
from lucid.ir import _xdsl as x
from lucid.ir import import_trace, parse_ir
from lucid.passes import (
    Instrumentation,
    PassFailure,
    PassManager,
    PipelineError,
    available_passes,
    get_pass,
    parse_pipeline_spec,
    register_pass,
)
from lucid.trace import trace


def _module():
    a = lucid.tensor(np.ones((2, 3), np.float32))
    return import_trace(trace(lambda t: (t * 1).exp() + (t * 1).exp(), a))


@dataclass(frozen=True)
class _Break(x.ModulePass):
    """Test pass: makes every lucid.exp claim a wrong result type, or raises."""

    name = "test-break"
    mode: str = "types"

    def apply(self, ctx, op):
        if self.mode == "raise":
            raise RuntimeError("boom from the pass")
        for o in op.walk():
            if o.name == "lucid.exp":
                x.Rewriter.replace_value_with_new_type(o.results[0], x.TensorType(x.f64, [2, 3]))


register_pass(_Break)


def test_builtins_are_registered_and_listed():
    names = available_passes()
    assert {"canonicalize", "cse", "dce", "test-break"} <= set(names)
    assert get_pass("cse").name == "cse"


def test_unknown_pass_lists_the_available_ones():
    with pytest.raises(PipelineError, match=r"unknown pass 'canonicalise'.*canonicalize"):
        parse_pipeline_spec("canonicalise,cse")


def test_bad_option_names_pass_and_options():
    with pytest.raises(PipelineError, match=r"bad options for pass 'canonicalize'.*fold-limit"):
        parse_pipeline_spec("canonicalize{nope=1}")
    with pytest.raises(PipelineError, match=r"bad options for pass 'canonicalize'"):
        parse_pipeline_spec("canonicalize{fold-limit=abc}")


def test_malformed_spec_is_a_pipeline_error():
    with pytest.raises(PipelineError, match="bad pass pipeline"):
        parse_pipeline_spec("canonicalize{fold-limit=1")


def test_options_reach_the_pass_and_round_trip_in_the_spec():
    (p,) = parse_pipeline_spec("canonicalize{fold-limit=7}")
    assert p.fold_limit == 7
    pm = PassManager("canonicalize{fold-limit=7},cse")
    assert PassManager(pm.spec).passes == pm.passes


def test_register_pass_rejects_non_passes_and_duplicates():
    with pytest.raises(TypeError):
        register_pass(object)

    @dataclass(frozen=True)
    class Other(x.ModulePass):
        name = "cse"

        def apply(self, ctx, op):
            pass

    with pytest.raises(ValueError, match="already registered"):
        register_pass(Other)


def _run(pipeline, **flags):
    out = io.StringIO()
    m = _module()
    PassManager(pipeline, stream=out, **flags).run(m)
    return out.getvalue(), m


def test_print_ir_after_all_prints_after_each_pass_including_the_last():
    text, _ = _run("canonicalize,cse,dce", print_ir_after_all=True)
    headers = [line for line in text.splitlines() if line.startswith("// -----// IR Dump")]
    assert headers == [
        "// -----// IR Dump After canonicalize //----- //",
        "// -----// IR Dump After cse //----- //",
        "// -----// IR Dump After dce //----- //",
    ]
    # the dump after cse has one exp, the one after canonicalize two
    dumps = text.split("// -----// IR Dump")
    assert dumps[1].count("lucid.exp") == 2 and dumps[2].count("lucid.exp") == 1


def test_print_ir_before_all():
    text, _ = _run("cse,dce", print_ir_before_all=True)
    assert text.count("IR Dump Before cse") == 1 and text.count("IR Dump Before dce") == 1
    assert "IR Dump After" not in text


def test_print_ir_after_change_skips_passes_that_change_nothing():
    text, _ = _run("canonicalize,dce,cse,cse", print_ir_after_change=True)
    headers = [line for line in text.splitlines() if line.startswith("// -----// IR Dump")]
    assert headers == [
        "// -----// IR Dump After canonicalize //----- //",
        "// -----// IR Dump After cse //----- //",
    ]


def test_print_ir_after_failure_names_the_pass_and_shows_the_ir():
    out = io.StringIO()
    with pytest.raises(PassFailure, match=r"pass 'test-break' failed: RuntimeError: boom") as e:
        PassManager("cse,test-break{mode=raise}", stream=out, print_ir_after_failure=True).run(
            _module()
        )
    assert e.value.pass_name == "test-break"
    assert "lucid.exp" in e.value.ir
    assert "IR Dump After test-break Failed" in out.getvalue()


def test_verify_each_catches_a_pass_that_breaks_the_ir():
    out = io.StringIO()
    m = _module()
    PassManager("test-break").run(m)  # without verification the broken IR goes through
    with pytest.raises(PassFailure, match="test-break") as e:
        PassManager("test-break", verify_each=True, print_ir_after_failure=True, stream=out).run(
            _module()
        )
    assert "lucid.exp" in str(e.value.cause)
    assert "IR Dump After test-break Failed Verification" in out.getvalue()


def test_tree_dir_gets_one_file_per_pass(tmp_path):
    _run("canonicalize,cse,dce", print_ir_tree_dir=str(tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["00_input.mlir", "01_canonicalize.mlir", "02_cse.mlir", "03_dce.mlir"]
    assert parse_ir((tmp_path / "02_cse.mlir").read_text()).verify() is None
    assert (tmp_path / "01_canonicalize.mlir").read_text().count("lucid.exp") == 2
    assert (tmp_path / "02_cse.mlir").read_text().count("lucid.exp") == 1


def test_timing_report_has_each_pass_with_op_counts():
    text, m = _run("canonicalize,cse,dce", timing=True)
    assert "Pass execution timing report" in text
    lines = {line.split()[-1]: line for line in text.splitlines() if "->" in line}
    assert set(lines) == {"canonicalize", "cse", "dce"}
    # counts include func.func and func.return; canonicalize drops both muls and their
    # constant (8 -> 5), cse merges the two exps (5 -> 4)
    assert "8 -> 5" in lines["canonicalize"] and "5 -> 4" in lines["cse"]


def test_report_gives_per_pass_milliseconds():
    report = PassManager("canonicalize,cse").run(_module())
    ms = report.passes_ms()
    assert set(ms) == {"canonicalize", "cse"} and all(v >= 0 for v in ms.values())
    assert report.records[0].ops_before is None  # counting is off unless asked


def test_generic_printing_flag():
    text, _ = _run("cse", print_ir_after_all=True, generic=True)
    assert '"lucid.exp"' in text


def test_instrumentation_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_PRINT_IR_AFTER_ALL", "1")
    monkeypatch.setenv("LUCID_COMPILE_VERIFY_EACH", "true")
    monkeypatch.setenv("LUCID_COMPILE_PRINT_IR_TREE_DIR", str(tmp_path))
    inst = Instrumentation.from_env()
    assert inst.print_ir_after_all and inst.verify_each and not inst.timing
    assert inst.print_ir_tree_dir == str(tmp_path)


def test_pass_instances_are_accepted_and_checked():
    from lucid.passes.cse import CSE

    PassManager([CSE()]).run(_module())
    with pytest.raises(TypeError):
        PassManager(["cse"])
