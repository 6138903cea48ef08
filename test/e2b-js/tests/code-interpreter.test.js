'use strict'
// The code interpreter through the unmodified @e2b/code-interpreter SDK: runCode
// results, streams and errors, rich outputs (PNG, charts, DataFrames), env vars per run
// and per sandbox, contexts (python, bash, cwd, restart, remove), the errors for an
// unknown language or context, a crashed kernel, an execution timeout, and the error a
// sandbox without the interpreter gives.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, SandboxError, NotFoundError, TimeoutError } = require('@e2b/code-interpreter')
const { setup } = require('./harness')

const srv = setup(test)
const PNG_HEADER = 'iVBORw0KGgo' // base64 of \x89PNG\r\n\x1a\n
let sbx

test.before(async () => {
  await srv.ensure()
  // The SDK's default template is code-interpreter-v1.
  sbx = srv.track(await Sandbox.create({ envs: { SBX_VAR: 'from-sandbox' }, timeoutMs: 600000 }))
})

const ms = (t0) => Date.now() - t0

test('runCode("1+1") returns the main result as text', { timeout: 120000 }, async () => {
  const ex = await sbx.runCode('1+1')
  assert.equal(ex.error, undefined)
  assert.equal(ex.results.length, 1)
  assert.equal(ex.results[0].text, '2')
  assert.equal(ex.results[0].isMainResult, true)
  assert.equal(ex.text, '2')
  assert.ok(ex.executionCount >= 1, `executionCount ${ex.executionCount}`)
  // The kernel keeps state between runs.
  await sbx.runCode('kept = 40')
  assert.equal((await sbx.runCode('kept + 2')).text, '42')
})

test('stdout and stderr reach the callbacks and the logs, in order', { timeout: 60000 }, async () => {
  const out = []
  const err = []
  const results = []
  const ex = await sbx.runCode('import sys\nprint("out-1")\nprint("err-1", file=sys.stderr)\nprint("out-2")\n"last"', {
    onStdout: (m) => out.push(m),
    onStderr: (m) => err.push(m),
    onResult: (r) => results.push(r),
  })
  assert.equal(out.map((m) => m.line).join(''), 'out-1\nout-2\n')
  assert.equal(err.map((m) => m.line).join(''), 'err-1\n')
  assert.equal(out[0].error, false)
  assert.equal(err[0].error, true)
  assert.equal(ex.logs.stdout.join(''), 'out-1\nout-2\n')
  assert.equal(ex.logs.stderr.join(''), 'err-1\n')
  assert.equal(results.length, 1)
  assert.equal(results[0].text, 'last')
})

test('an exception becomes execution.error with name, value and traceback', { timeout: 60000 }, async () => {
  const errors = []
  const ex = await sbx.runCode('def f():\n    raise ValueError("boom 42")\nf()', { onError: (e) => errors.push(e) })
  assert.ok(ex.error, 'execution.error set')
  assert.equal(ex.error.name, 'ValueError')
  assert.equal(ex.error.value, 'boom 42')
  assert.equal(typeof ex.error.traceback, 'string')
  assert.match(ex.error.traceback, /ValueError/)
  assert.match(ex.error.traceback, /f\(\)/)
  assert.doesNotMatch(ex.error.traceback, /\x1b\[/, 'no terminal colours in the traceback')
  assert.equal(errors.length, 1)
  assert.equal(ex.results.length, 0)
  // A syntax error too.
  const se = await sbx.runCode('def (')
  assert.equal(se.error && se.error.name, 'SyntaxError')
})

test('a matplotlib line plot gives a PNG and a line chart', { timeout: 120000 }, async () => {
  const ex = await sbx.runCode(`
import numpy as np
import matplotlib.pyplot as plt
x = np.linspace(0, 10, 50)
plt.figure(figsize=(8, 4))
plt.plot(x, np.sin(x), label='sin(x)')
plt.title('Plot of sin(x)')
plt.xlabel('X axis')
plt.ylabel('Y axis')
plt.legend()
plt.show()
`)
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}\n${ex.error.traceback}`)
  const r = ex.results.find((x) => x.png)
  assert.ok(r, `a result with png among ${JSON.stringify(ex.results.map((x) => x.formats()))}`)
  assert.ok(r.png.startsWith(PNG_HEADER), `png is base64 PNG: ${r.png.slice(0, 20)}`)
  assert.ok(Buffer.from(r.png, 'base64').length > 1000)
  assert.ok(r.chart, 'chart set')
  assert.equal(r.chart.type, 'line')
  assert.equal(r.chart.title, 'Plot of sin(x)')
  assert.equal(r.chart.x_label, 'X axis')
  assert.equal(r.chart.y_label, 'Y axis')
  assert.equal(r.chart.elements.length, 1)
  assert.equal(r.chart.elements[0].label, 'sin(x)')
  assert.equal(r.chart.elements[0].points.length, 50)
})

test('a matplotlib bar plot gives a bar chart', { timeout: 60000 }, async () => {
  const ex = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.bar(['A', 'B', 'C'], [10, 20, 30], label='Sold')
plt.title('Sales')
plt.show()
`)
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}`)
  const r = ex.results.find((x) => x.chart)
  assert.ok(r, `a result with a chart among ${JSON.stringify(ex.results.map((x) => x.formats()))}`)
  assert.ok(r.png && r.png.startsWith(PNG_HEADER))
  assert.equal(r.chart.type, 'bar')
  assert.equal(r.chart.title, 'Sales')
  assert.deepEqual(r.chart.elements.map((e) => [e.label, e.value, e.group]), [['A', 10, 'Sold'], ['B', 20, 'Sold'], ['C', 30, 'Sold']])
})

test('a pandas DataFrame result carries its columns as data (and HTML)', { timeout: 60000 }, async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})')
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}`)
  const r = ex.results[0]
  assert.equal(r.isMainResult, true)
  assert.deepEqual(r.data, { a: [1, 2, 3], b: ['x', 'y', 'z'] })
  assert.match(r.html, /<table/)
  assert.ok(r.formats().includes('data'))
})

test("a run's envs are visible in that run only; the sandbox's envs in every run", { timeout: 60000 }, async () => {
  const get = (name) => `import os\nos.environ.get(${JSON.stringify(name)}, "unset")`
  assert.equal((await sbx.runCode(get('RUN_VAR'), { envs: { RUN_VAR: 'run-1' } })).text, 'run-1')
  assert.equal((await sbx.runCode(get('RUN_VAR'))).text, 'unset')
  assert.equal((await sbx.runCode(get('SBX_VAR'))).text, 'from-sandbox')
  // A run may override a sandbox var; the next run sees the sandbox's value again.
  assert.equal((await sbx.runCode(get('SBX_VAR'), { envs: { SBX_VAR: 'overridden' } })).text, 'overridden')
  assert.equal((await sbx.runCode(get('SBX_VAR'))).text, 'from-sandbox')
  // Child processes of the kernel see them too.
  const sub = await sbx.runCode('import subprocess\nprint(subprocess.run(["sh", "-c", "echo $RUN_VAR"], capture_output=True, text=True).stdout, end="")', {
    envs: { RUN_VAR: 'child' },
  })
  assert.equal(sub.logs.stdout.join(''), 'child\n')
})

test('python and bash contexts: cwd, isolation, list, restart, remove', { timeout: 180000 }, async () => {
  const py = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
  assert.ok(py.id, 'context id')
  assert.equal(py.language, 'python')
  assert.equal(py.cwd, '/tmp')
  assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: py })).text, '/tmp')
  await sbx.runCode('ctx_only = "in py context"', { context: py })
  assert.equal((await sbx.runCode('ctx_only', { context: py })).text, 'in py context')
  const other = await sbx.runCode('ctx_only')
  assert.equal(other.error && other.error.name, 'NameError', 'the default context does not see it')

  const sh = await sbx.createCodeContext({ language: 'bash' })
  assert.equal(sh.language, 'bash')
  const hi = await sbx.runCode('echo hi; pwd', { context: sh })
  assert.equal(hi.error, undefined, hi.error && `${hi.error.name}: ${hi.error.value}`)
  assert.equal(hi.logs.stdout.join(''), 'hi\n/home/user\n')
  // language: 'bash' without a context uses bash's default context.
  const byLang = await sbx.runCode('echo "$((6 * 7))"', { language: 'bash' })
  assert.equal(byLang.logs.stdout.join(''), '42\n')

  const listed = await sbx.listCodeContexts()
  const ids = listed.map((c) => c.id)
  assert.ok(ids.includes(py.id) && ids.includes(sh.id), `list ${JSON.stringify(listed)}`)
  assert.deepEqual(listed.find((c) => c.id === py.id), { id: py.id, language: 'python', cwd: '/tmp' })

  await sbx.restartCodeContext(py)
  const gone = await sbx.runCode('ctx_only', { context: py })
  assert.equal(gone.error && gone.error.name, 'NameError', 'restart cleared the state')
  assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: py })).text, '/tmp', 'restart keeps the cwd')

  await sbx.removeCodeContext(py)
  await sbx.removeCodeContext(sh.id)
  const after = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(!after.includes(py.id) && !after.includes(sh.id), `removed contexts still listed: ${after}`)
  await assert.rejects(sbx.runCode('1', { context: py }), (e) => e instanceof NotFoundError)
})

test('an unknown language or context is an error; the default kernel still works', { timeout: 60000 }, async () => {
  // 400 from the server: the SDK surfaces a SandboxError with the status (no body
  // without diagnostics), not a NotFoundError or TimeoutError.
  await assert.rejects(sbx.runCode('1', { language: 'cobol' }), (e) => {
    assert.ok(e instanceof SandboxError && !(e instanceof NotFoundError) && !(e instanceof TimeoutError), `${e.name}: ${e.message}`)
    assert.match(e.message, /400/)
    return true
  })
  await assert.rejects(sbx.createCodeContext({ language: 'cobol' }), (e) => {
    assert.ok(e instanceof SandboxError && !(e instanceof NotFoundError), `${e.name}: ${e.message}`)
    assert.match(e.message, /400/)
    return true
  })
  // 404: a NotFoundError whose message is the server's body, naming the context.
  await assert.rejects(sbx.runCode('1', { context: { id: 'no-such-context', language: 'python', cwd: '/' } }), (e) => {
    assert.ok(e instanceof NotFoundError, `${e.name}: ${e.message}`)
    assert.match(e.message, /no-such-context/)
    return true
  })
  await assert.rejects(sbx.restartCodeContext('no-such-context'), NotFoundError)
  await assert.rejects(sbx.removeCodeContext('no-such-context'), NotFoundError)
  assert.equal((await sbx.runCode('1+1')).text, '2')
})

test('a kernel crash ends the run with an error; the next run gets a fresh kernel', { timeout: 120000 }, async () => {
  await sbx.runCode('before_crash = 1')
  const t0 = Date.now()
  // The pause lets the kernel's IO thread send the line: a SIGKILL drops what zmq
  // still queues.
  const ex = await sbx.runCode('import os, time\nprint("about to die", flush=True)\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)', { timeoutMs: 30000 })
  assert.ok(ms(t0) < 20000, `crash run took ${ms(t0)} ms`)
  assert.ok(ex.error, 'execution.error set')
  assert.equal(ex.error.name, 'UnexpectedEndOfExecution')
  assert.match(ex.error.value, /kernel/i)
  assert.equal(ex.logs.stdout.join(''), 'about to die\n', 'output sent before the crash is kept')
  const next = await sbx.runCode('1+1', { timeoutMs: 60000 })
  assert.equal(next.text, '2')
  assert.equal((await sbx.runCode('"before_crash" in dir()')).text, 'False', 'the new kernel has fresh state')
})

test('timeoutMs ends a long run with TimeoutError; the next run works promptly', { timeout: 120000 }, async () => {
  await sbx.runCode('before_timeout = 7')
  const t0 = Date.now()
  await assert.rejects(sbx.runCode('import time\ntime.sleep(30)', { timeoutMs: 2000 }), (e) => {
    assert.ok(e instanceof TimeoutError, `${e.name}: ${e.message}`)
    return true
  })
  assert.ok(ms(t0) < 10000, `timed-out run returned after ${ms(t0)} ms`)
  const t1 = Date.now()
  const next = await sbx.runCode('1+1', { timeoutMs: 20000 })
  assert.equal(next.text, '2')
  assert.ok(ms(t1) < 8000, `the next run took ${ms(t1)} ms`)
  // The sleep was interrupted, not the kernel restarted: state survives.
  assert.equal((await sbx.runCode('before_timeout')).text, '7')
})

test('runCode on a plain base sandbox fails with a clear error naming the code interpreter', { timeout: 120000 }, async () => {
  const plain = srv.track(await Sandbox.create('base', { timeoutMs: 120000 }))
  const t0 = Date.now()
  await assert.rejects(plain.runCode('1+1', { timeoutMs: 30000, requestTimeoutMs: 30000 }), (e) => {
    assert.ok(!(e instanceof TimeoutError), `got a TimeoutError: ${e.message}`)
    assert.ok(e instanceof NotFoundError, `${e.name}: ${e.message}`)
    assert.match(e.message, /code interpreter/i)
    assert.match(e.message, /code-interpreter-v1/)
    return true
  })
  assert.ok(ms(t0) < 10000, `the error came after ${ms(t0)} ms`)
  await plain.kill()
})
