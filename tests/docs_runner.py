"""Runs the code blocks of the docs for tests/test_docs.py (not a test module itself).

One long-lived process: it imports Lucid and the compiler once, writes the sample files shell
blocks may read, then serves requests, one JSON line each on stdin: a chain of blocks (a block
and its continuations) to run in a scratch folder. Each chain runs in a forked child, so blocks
of different chains share no state (registered ops and passes, the RNG, the environment, the
working folder) while costing no interpreter start-up; a chain past its timeout is killed with
its subprocesses. The answer is one JSON line: one result per block run. A request with
``"fresh_process": true`` runs its chain in a fresh interpreter, as every chain does where
forking is unsafe.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

SHELL_FLAGS = ["-e", "-o", "pipefail", "-x"]  # stop at the first failing command, show it


def write_sample_files(folder: str) -> None:
    """The files the docs' shell blocks read (see tests/test_docs.py)."""
    import numpy as np

    import lucid
    import lucid.nn as nn
    from lucid.ir import import_trace, print_ir
    from lucid.trace import _tracing, trace

    # docs/passes.md, section 1: the module a pass author starts from.
    w = lucid.tensor(np.ones((4, 3), np.float32))
    x = lucid.tensor(np.ones((2, 4), np.float32))
    traced = trace(lambda x: (x @ w * 1).exp().sum(1), x)
    with open(os.path.join(folder, "model.mlir"), "w") as f:
        f.write(print_ir(import_trace(traced)))
    with open(os.path.join(folder, "trace.json"), "w") as f:
        f.write(traced.to_json())
    # A symbolic batch (tensor<?x8xf32>), for shape-specialize.
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    with _tracing(model) as tracer:
        symbolic = tracer.finish(model(tracer.input((None, 8))))
    with open(os.path.join(folder, "symbolic.mlir"), "w") as f:
        f.write(print_ir(import_trace(symbolic)))


def preload() -> None:
    """What most blocks import, so each forked chain starts warm."""
    import lucid
    import lucid._dispatch
    import lucid.compile  # noqa: F401  (loads xDSL, the passes and the CPU backend)
    import lucid.ir  # noqa: F401
    import lucid.nn  # noqa: F401
    import lucid.passes  # noqa: F401
    from lucid.backends import get_backend

    lucid._dispatch.CHECK_INFERENCE = True  # as tests/conftest.py: kernels match inference
    get_backend("cpu")


def tail(text: str, lines: int = 40) -> str:
    parts = text.rstrip().splitlines()
    return "\n".join(parts[-lines:])


def run_python(block: dict, namespace: dict) -> None:
    # Pad with newlines so tracebacks give the doc's own line numbers.
    source = "\n" * block["line"] + block["code"]
    code = compile(source, block["abspath"], "exec")
    exec(code, namespace)


def run_shell(block: dict, env: dict) -> None:
    out = subprocess.run(
        ["bash", *SHELL_FLAGS, "-c", block["code"]],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"exit status {out.returncode}\n--- stdout ---\n{tail(out.stdout)}\n"
            f"--- stderr ---\n{tail(out.stderr)}"
        )


def run_chain(request: dict, samples: str) -> list[dict]:
    """In the forked child: run the chain's blocks in order, stop at the first failure."""
    os.chdir(request["cwd"])
    shutil.copytree(samples, request["cwd"], dirs_exist_ok=True)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    namespace: dict = {"__name__": "__main__"}
    results = []
    for block in request["blocks"]:
        t0 = time.perf_counter()
        result = {"line": block["line"], "ok": True}
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                if block["lang"] == "python":
                    run_python(block, namespace)
                else:
                    run_shell(block, env)
        except BaseException as e:  # noqa: BLE001 - any failure of a block is its result
            result["ok"] = False
            if isinstance(e, RuntimeError) and block["lang"] == "sh":
                result["error"] = str(e)
            else:
                tb = e.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                    tb = tb.tb_next  # the block's own frames only
                result["error"] = "".join(traceback.format_exception(type(e), e, tb))
            result["printed"] = tail(printed.getvalue(), 20)
        result["seconds"] = time.perf_counter() - t0
        results.append(result)
        if not result["ok"]:
            break
    return results


# Forking a warm process is what makes a chain cheap; where fork is unsafe after the frameworks
# have loaded (macOS's Objective-C runtime and libdispatch), each chain gets a fresh interpreter.
USE_FORK = (
    hasattr(os, "fork")
    and sys.platform.startswith("linux")
    and os.environ.get("LUCID_DOCS_NO_FORK") != "1"
)


def read_results(result_path: str) -> dict:
    try:
        with open(result_path) as f:
            results = json.load(f)
    except (OSError, json.JSONDecodeError):
        results = [{"line": 0, "ok": False, "error": "the chain's process died without a result"}]
    return {"results": results}


def serve_spawned(request: dict, samples: str) -> dict:
    folder = tempfile.mkdtemp(prefix="lucid-docs-chain-")
    request_path, result_path = (os.path.join(folder, n) for n in ("request.json", "result.json"))
    with open(request_path, "w") as f:
        json.dump(request, f)
    child = subprocess.Popen(
        [sys.executable, __file__, "--chain", request_path, samples, result_path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: a timeout kills its commands too
    )
    try:
        child.wait(timeout=request["timeout"])
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        shutil.rmtree(folder, ignore_errors=True)
        return {"timeout": True}
    answer = read_results(result_path)
    shutil.rmtree(folder, ignore_errors=True)
    return answer


def run_chain_to_file(request: dict, samples: str, result_path: str) -> int:
    try:
        results = run_chain(request, samples)
        status = 0
    except BaseException:  # noqa: BLE001
        results = [{"line": 0, "ok": False, "error": traceback.format_exc()}]
        status = 1
    with open(result_path, "w") as f:
        json.dump(results, f)
    return status


def serve_one(request: dict, samples: str) -> dict:
    if not USE_FORK or request.get("fresh_process"):
        return serve_spawned(request, samples)
    fd, result_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    pid = os.fork()
    if pid == 0:  # the child: its own process group, so a timeout kills its commands too
        status = 0
        try:
            os.setpgid(0, 0)
            # Native code printing to fd 1 must not reach the protocol stream.
            sink = os.open(os.devnull, os.O_WRONLY)
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            status = run_chain_to_file(request, samples, result_path)
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    deadline = time.monotonic() + request["timeout"]
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.unlink(result_path)
            return {"timeout": True}
        time.sleep(0.01)
    answer = read_results(result_path)
    os.unlink(result_path)
    return answer


def main() -> None:
    if sys.argv[1:2] == ["--chain"]:  # one chain in this fresh process (see USE_FORK)
        request_path, samples, result_path = sys.argv[2:5]
        with open(request_path) as f:
            request = json.load(f)
        preload()
        sys.exit(run_chain_to_file(request, samples, result_path))
    preload()
    samples = tempfile.mkdtemp(prefix="lucid-docs-samples-")
    write_sample_files(samples)
    protocol = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the protocol stream
    print(json.dumps({"ready": True}), file=protocol, flush=True)
    try:
        for line in sys.stdin:
            answer = serve_one(json.loads(line), samples)
            print(json.dumps(answer), file=protocol, flush=True)
    finally:
        shutil.rmtree(samples, ignore_errors=True)


if __name__ == "__main__":
    main()
