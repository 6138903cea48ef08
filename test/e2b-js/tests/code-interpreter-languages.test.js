'use strict'
// The code interpreter's other languages through the unmodified @e2b/code-interpreter
// SDK: JavaScript and TypeScript (Deno's kernel), R (IRkernel) and Java (Cubicle's
// JShell kernel) in code-interpreter-v1. What e2b's template answers: the default
// contexts listed from the start, output and results as text, a sandbox's and a
// run's env vars (Java shows them as system properties), the working directory,
// errors, and an interrupt that leaves the context usable.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox } = require('@e2b/code-interpreter')
const { setup } = require('./harness')

const srv = setup(test)
let sbx

test.before(async () => {
  await srv.ensure()
  sbx = srv.track(await Sandbox.create({ envs: { SBX_VAR: 'from-sandbox' }, timeoutMs: 600000 }))
})

const text = (ex) => {
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}`)
  return ex.results.length ? ex.results[0].text.trim() : undefined
}

test('python and javascript default contexts are listed from the start, each once', { timeout: 60000 }, async () => {
  const langs = (await sbx.listCodeContexts()).map((c) => c.language)
  assert.equal(langs.filter((l) => l === 'python').length, 1, `contexts: ${langs}`)
  assert.equal(langs.filter((l) => l === 'javascript').length, 1, `contexts: ${langs}`)
  const js = (await sbx.listCodeContexts()).find((c) => c.language === 'javascript')
  assert.equal(js.cwd, '/home/user')
  // language: 'js' runs on that listed context.
  await sbx.runCode('globalThis.seen = 7', { language: 'js' })
  assert.equal(text(await sbx.runCode('seen', { context: js })), '7')
  const after = (await sbx.listCodeContexts()).filter((c) => c.language === 'javascript')
  assert.deepEqual(after.map((c) => c.id), [js.id])
})

test('javascript: stdout, ESM imports, top-level await, strings as their text, many results in a row', { timeout: 120000 }, async () => {
  assert.deepEqual((await sbx.runCode('console.log("Hello World!")', { language: 'js' })).logs.stdout, ['Hello World!\n'])
  const esm = await sbx.runCode("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", { language: 'js' })
  assert.deepEqual(esm.logs.stdout, ['function\n'])
  assert.equal((await sbx.runCode("await Promise.resolve('Hello World!')", { language: 'js' })).text, 'Hello World!')
  assert.equal(text(await sbx.runCode('({ a: 1, b: [1, 2] })', { language: 'js' })), '{ a: 1, b: [ 1, 2 ] }')
  // Deno publishes a result after its idle status; each run still gets its own.
  for (let i = 0; i < 15; i++) {
    assert.equal((await sbx.runCode(`${i} * 2`, { language: 'javascript' })).text, String(i * 2), `run ${i}`)
  }
  const err = await sbx.runCode('throw new TypeError("bad value")', { language: 'js' })
  assert.equal(err.error && err.error.name, 'TypeError')
  assert.equal(err.error.value, 'bad value')
})

test('typescript runs typed code', { timeout: 60000 }, async () => {
  const ex = await sbx.runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' })
  assert.deepEqual(ex.logs.stdout, ['Hello World!\n'])
  assert.equal((await sbx.runCode('process.cwd()', { language: 'ts' })).text, '/home/user')
})

test('r: print, results as R shows them, env vars, cwd, errors', { timeout: 120000 }, async () => {
  assert.deepEqual((await sbx.runCode('print("Hello, World!")', { language: 'r' })).logs.stdout, ['[1] "Hello, World!"\n'])
  assert.equal(text(await sbx.runCode('getwd()', { language: 'r' })), '[1] "/home/user"')
  assert.equal(text(await sbx.runCode('Sys.getenv("SBX_VAR")', { language: 'r' })), '[1] "from-sandbox"')
  assert.equal(text(await sbx.runCode('Sys.getenv("RUN_VAR")', { language: 'r', envs: { RUN_VAR: 'x"y' } })), '[1] "x\\"y"')
  assert.equal(text(await sbx.runCode('Sys.getenv("RUN_VAR", unset = "default")', { language: 'r' })), '[1] "default"')
  const err = await sbx.runCode('stop("r failed")', { language: 'r' })
  assert.ok(err.error, 'an R error is execution.error')
  assert.match(err.error.value, /r failed/)
})

test('java: println, state, env vars as system properties, cwd, compile and runtime errors', { timeout: 180000 }, async () => {
  const hello = await sbx.runCode('System.out.println("Hello, World!")', { language: 'java' })
  assert.equal(hello.error, undefined, hello.error && hello.error.value)
  assert.equal(hello.logs.stdout.join(''), 'Hello, World!\n')
  await sbx.runCode('int kept = 40;', { language: 'java' })
  assert.equal(text(await sbx.runCode('kept + 2', { language: 'java' })), '42')
  assert.equal(text(await sbx.runCode('"a" + "b"', { language: 'java' })), 'ab', 'a String result is its text')
  assert.equal(text(await sbx.runCode('System.getProperty("SBX_VAR")', { language: 'java' })), 'from-sandbox')
  assert.equal(text(await sbx.runCode('System.getProperty("SBX_VAR")', { language: 'java', envs: { SBX_VAR: 'overwrite' } })), 'overwrite')
  assert.equal(text(await sbx.runCode('System.getProperty("SBX_VAR")', { language: 'java' })), 'from-sandbox', 'the run\'s value is undone')
  assert.equal(text(await sbx.runCode('System.getProperty("RUN_ONLY", "default")', { language: 'java' })), 'default')
  assert.equal(text(await sbx.runCode('System.getProperty("user.dir")', { language: 'java' })), '/home/user')
  const compile = await sbx.runCode('int x = "not an int";', { language: 'java' })
  assert.ok(compile.error, 'a compile error is execution.error')
  assert.match(compile.error.value, /incompatible types/)
  const thrown = await sbx.runCode('throw new IllegalStateException("boom")', { language: 'java' })
  assert.ok(thrown.error, 'an exception is execution.error')
  assert.equal(thrown.error.value, 'boom')
  assert.match(thrown.error.traceback, /IllegalStateException/)
})

test('an interrupted java or javascript run leaves its context usable', { timeout: 180000 }, async () => {
  for (const [language, loop, after] of [
    ['java', 'while (true) { }', '1 + 1'],
    ['js', 'while (true) { }', '1 + 1'],
  ]) {
    await assert.rejects(sbx.runCode(loop, { language, timeoutMs: 3000 }))
    const t0 = Date.now()
    let ex
    // The interrupt lands when the server sees the client gone; bounded retries.
    for (let i = 0; i < 10; i++) {
      try {
        ex = await sbx.runCode(after, { language, timeoutMs: 15000 })
        break
      } catch (e) {
        if (i === 9) throw e
      }
    }
    assert.equal(ex.text, '2', `${language} after interrupt (${Date.now() - t0} ms)`)
  }
})
