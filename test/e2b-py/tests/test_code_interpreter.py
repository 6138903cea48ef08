"""e2b-code-interpreter against the code interpreter Cubicle runs on port 49999
of template code-interpreter-v1, checked against e2b's documented behaviour:
results and their formats (text, png + chart, DataFrame data), stdout/stderr
callbacks, errors, per-run env vars, contexts (python, bash: create, list,
restart, remove), unknown languages and contexts, a crashing kernel and an
execution timeout, each followed by a run that works."""

import base64
import re
import time

import pytest
from e2b_code_interpreter import (
    AsyncSandbox,
    Context,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)
from e2b_code_interpreter.charts import ChartType

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ci(server):
    s = server.track(Sandbox.create(timeout=600))
    yield s
    s.kill()


def test_the_default_template_is_code_interpreter_v1_and_1_plus_1_is_2(ci):
    ex = ci.run_code("1+1")
    assert ex.error is None, ex.error
    assert ex.text == "2"
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1 and main[0].text == "2"
    assert isinstance(ex.execution_count, int) and ex.execution_count >= 1


def test_state_persists_between_runs(ci):
    ci.run_code("persisted = 40")
    assert ci.run_code("persisted + 2").text == "42"


def test_stdout_and_stderr_stream_to_callbacks_and_logs(ci):
    out, err, results = [], [], []
    ex = ci.run_code(
        "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n'done'",
        on_stdout=out.append,
        on_stderr=err.append,
        on_result=results.append,
    )
    assert ex.logs.stdout == ["to stdout\n"]
    assert ex.logs.stderr == ["to stderr\n"]
    assert [m.line for m in out] == ["to stdout\n"]
    assert [m.line for m in err] == ["to stderr\n"]
    assert out[0].error is False and err[0].error is True
    # e2b strips the quotes IPython puts around a str result.
    assert [r.text for r in results] == ["done"]
    assert ex.text == "done"


def test_an_exception_is_reported_with_name_value_and_traceback(ci):
    errors = []
    ex = ci.run_code("def f():\n    raise ValueError('boom')\nf()", on_error=errors.append)
    assert ex.error is not None
    assert ex.error.name == "ValueError"
    assert ex.error.value == "boom"
    # IPython may colour the traceback; e2b passes the escapes through.
    tb = re.sub(r"\x1b\[[0-9;]*m", "", ex.error.traceback)
    assert "ValueError" in tb and "f()" in tb, tb
    assert len(errors) == 1 and errors[0].name == "ValueError"
    assert ex.results == []
    # The kernel is fine afterwards.
    assert ci.run_code("2*3").text == "6"


def test_a_matplotlib_plot_is_a_png_and_a_chart(ci):
    ex = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure()\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='sq')\n"
        "plt.title('squares')\n"
        "plt.xlabel('x'); plt.ylabel('y')\n"
        "plt.show()\n"
    )
    assert ex.error is None, ex.error
    pngs = [r for r in ex.results if r.png]
    assert len(pngs) == 1, ex.results
    assert base64.b64decode(pngs[0].png).startswith(PNG_MAGIC)
    chart = pngs[0].chart
    assert chart is not None, "chart extracted from the figure"
    assert chart.type == ChartType.LINE
    assert chart.title == "squares"
    assert chart.x_label == "x" and chart.y_label == "y"
    assert len(chart.elements) == 1
    assert [tuple(float(v) for v in p) for p in chart.elements[0].points] == [(1.0, 1.0), (2.0, 4.0), (3.0, 9.0)]


def test_a_dataframe_result_carries_its_data(ci):
    ex = ci.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1
    assert main[0].data == {"a": [1, 2], "b": ["x", "y"]}
    assert main[0].html and "<table" in main[0].html
    assert "data" in main[0].formats()


def test_env_vars_apply_to_one_run_only(ci):
    ex = ci.run_code("import os\nos.environ.get('RUN_VAR', 'unset')", envs={"RUN_VAR": "per-run"})
    assert ex.text == "per-run"
    assert ci.run_code("import os\nos.environ.get('RUN_VAR', 'unset')").text == "unset"


def test_python_context_with_cwd_has_its_own_state_and_can_be_restarted_and_removed(ci):
    ctx = ci.create_code_context(cwd="/tmp", language="python")
    assert ctx.id and ctx.language == "python" and ctx.cwd == "/tmp"
    assert ci.run_code("import os\nos.getcwd()", context=ctx).text == "/tmp"
    ci.run_code("only_here = 1", context=ctx)
    assert ci.run_code("only_here", context=ctx).text == "1"
    assert ci.run_code("only_here").error.name == "NameError", "contexts do not share state"

    ids = [c.id for c in ci.list_code_contexts()]
    assert ctx.id in ids

    ci.restart_code_context(ctx)
    ex = ci.run_code("only_here", context=ctx)
    assert ex.error is not None and ex.error.name == "NameError", "restart clears the state"
    assert ci.run_code("1+1", context=ctx).text == "2"

    ci.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in ci.list_code_contexts()]
    with pytest.raises(NotFoundException):
        ci.run_code("1", context=ctx)


def _stdout(ex) -> str:
    return "".join(ex.logs.stdout).replace("\r\n", "\n")


def test_bash_context_and_bash_language(ci):
    ctx = ci.create_code_context(language="bash", cwd="/home/user")
    assert ctx.language == "bash"
    ex = ci.run_code("echo $((40+2)); pwd", context=ctx)
    assert ex.error is None, ex.error
    assert _stdout(ex) == "42\n/home/user\n"
    ci.run_code("export KEPT=yes", context=ctx)
    assert _stdout(ci.run_code("echo $KEPT", context=ctx)) == "yes\n"
    # language= uses that language's default context.
    assert _stdout(ci.run_code("echo via-language", language="bash")) == "via-language\n"
    ci.remove_code_context(ctx)


def test_an_unknown_language_is_an_error_and_the_kernel_survives(ci):
    with pytest.raises(SandboxException):
        ci.run_code("print(1)", language="no-such-language")
    with pytest.raises(SandboxException):
        ci.create_code_context(language="no-such-language")
    assert ci.run_code("1+1").text == "2"


def test_an_unknown_context_is_not_found_and_the_kernel_survives(ci):
    with pytest.raises(NotFoundException):
        ci.run_code("1", context=Context("no-such-context", "python", "/home/user"))
    assert ci.run_code("1+1").text == "2"


def test_a_kernel_crash_is_reported_and_the_next_run_works(ci):
    ctx = ci.create_code_context()
    t0 = time.monotonic()
    try:
        err = ci.run_code("import os\nos.kill(os.getpid(), 9)", context=ctx, timeout=60).error
    except TimeoutException as e:
        pytest.fail(f"the crash was not reported: the run timed out ({e})")
    except SandboxException as e:
        err = e
    assert err is not None, "the crash is reported as the run's error"
    assert time.monotonic() - t0 < 30, f"the crash took {time.monotonic() - t0:.0f} s to report: {err!r}"
    assert ci.run_code("1+1", context=ctx, timeout=60).text == "2", "the context's kernel came back"
    assert ci.run_code("1+1").text == "2", "the default context is unaffected"
    ci.remove_code_context(ctx)


def test_an_execution_timeout_is_timeout_exception_and_the_next_run_works(ci):
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        ci.run_code("import time\ntime.sleep(30)", timeout=2)
    assert time.monotonic() - t0 < 10
    # The abandoned cell is interrupted rather than left holding the kernel
    # for the rest of its 30 s (e2b's server would make the next run wait).
    t1 = time.monotonic()
    assert ci.run_code("1+1", timeout=20).text == "2"
    assert time.monotonic() - t1 < 20


async def test_async_run_code_callbacks_and_contexts(server):
    s = server.track(await AsyncSandbox.create(timeout=300))
    try:
        out = []
        ex = await s.run_code("print('async out')\n3*3", on_stdout=out.append)
        assert ex.text == "9"
        assert [m.line for m in out] == ["async out\n"]
        ctx = await s.create_code_context(cwd="/tmp")
        assert (await s.run_code("import os\nos.getcwd()", context=ctx)).text == "/tmp"
        assert ctx.id in [c.id for c in await s.list_code_contexts()]
        await s.remove_code_context(ctx)
        with pytest.raises(TimeoutException):
            await s.run_code("import time\ntime.sleep(30)", timeout=2)
        assert (await s.run_code("1+1", timeout=20)).text == "2"
    finally:
        await s.kill()
