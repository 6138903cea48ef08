"""e2b-code-interpreter's other languages in code-interpreter-v1, as e2b's
template answers them: JavaScript and TypeScript (Deno's kernel), R (IRkernel)
and Java (Cubicle's JShell kernel). The default contexts listed from the
start, stdout and results as text, a sandbox's and a run's env vars (Java
shows them as system properties), the working directory, errors, and a
box-and-whisker chart (matplotlib pinned to e2b's version), sync and async."""

import pytest
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.charts import ChartType


@pytest.fixture(scope="module")
def ci(server):
    s = server.track(Sandbox.create(timeout=600, envs={"SBX_VAR": "from-sandbox"}))
    yield s
    s.kill()


def _text(ex) -> str:
    assert ex.error is None, ex.error
    return ex.results[0].text.strip()


def test_python_and_javascript_default_contexts_are_listed_from_the_start(ci):
    langs = [c.language for c in ci.list_code_contexts()]
    assert langs.count("python") == 1 and langs.count("javascript") == 1, langs


def test_javascript_and_typescript(ci):
    assert ci.run_code("console.log('Hello, World!')", language="js").logs.stdout == ["Hello, World!\n"]
    esm = ci.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", language="js")
    assert esm.logs.stdout == ["function\n"]
    assert ci.run_code("await Promise.resolve('Hello World!')", language="js").text == "Hello World!"
    assert ci.run_code("process.env.SBX_VAR", language="javascript").text == "from-sandbox"
    assert ci.run_code("process.env.RUN_VAR", language="js", envs={"RUN_VAR": "bar"}).text == "bar"
    assert ci.run_code("process.env.RUN_VAR || 'default'", language="js").text == "default"
    assert ci.run_code("process.cwd()", language="ts").text == "/home/user"
    ts = ci.run_code("const message: string = 'Hello, World!'; console.log(message)", language="ts")
    assert ts.logs.stdout == ["Hello, World!\n"]


def test_r(ci):
    assert ci.run_code('print("Hello, World!")', language="r").logs.stdout == ['[1] "Hello, World!"\n']
    assert _text(ci.run_code('Sys.getenv("SBX_VAR")', language="r")) == '[1] "from-sandbox"'
    assert _text(ci.run_code('Sys.getenv("SBX_VAR")', language="r", envs={"SBX_VAR": "overwrite"})) == '[1] "overwrite"'
    assert _text(ci.run_code('Sys.getenv("SBX_VAR")', language="r")) == '[1] "from-sandbox"'
    assert _text(ci.run_code("getwd()", language="r")) == '[1] "/home/user"'


def test_java(ci):
    hello = ci.run_code('System.out.println("Hello, World!")', language="java")
    assert hello.error is None, hello.error
    assert "".join(hello.logs.stdout) == "Hello, World!\n"
    assert _text(ci.run_code('System.getProperty("SBX_VAR")', language="java")) == "from-sandbox"
    assert _text(ci.run_code('System.getProperty("FOO")', language="java", envs={"FOO": "bar"})) == "bar"
    assert _text(ci.run_code('System.getProperty("FOO", "default")', language="java")) == "default"
    assert _text(ci.run_code('System.getProperty("user.dir")', language="java")) == "/home/user"
    err = ci.run_code("undefinedMethod()", language="java")
    assert err.error is not None and "cannot find symbol" in err.error.value, err.error


def test_a_box_and_whisker_chart(ci):
    ex = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.set_title('Scores')\n"
        "ax.set_xlabel('Class')\n"
        "ax.set_ylabel('Score')\n"
        "ax.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], labels=['A', 'B'], patch_artist=True)\n"
        "plt.show()"
    )
    assert ex.error is None, ex.error
    chart = ex.results[0].chart
    assert chart is not None and chart.type == ChartType.BOX_AND_WHISKER
    assert chart.title == "Scores" and chart.x_label == "Class"
    assert [e.label for e in chart.elements] == ["A", "B"]


async def test_async_languages(server):
    s = await AsyncSandbox.create(timeout=300)
    server.track(s)
    try:
        langs = [c.language for c in await s.list_code_contexts()]
        assert "javascript" in langs, langs
        assert (await s.run_code("1 + 2", language="js")).text == "3"
        r = await s.run_code('Sys.getenv("FOO")', language="r", envs={"FOO": "bar"})
        assert r.results[0].text.strip() == '[1] "bar"'
    finally:
        await s.kill()
