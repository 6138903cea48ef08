'use strict'
// commands.*: run, stdout/stderr/exit codes, envs, cwd, users, background processes,
// connect, kill, stdin and list.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, CommandExitError, TimeoutError } = require('e2b')
const { setup, waitFor, sleep } = require('./harness')

const srv = setup(test)
let sbx

test.before(async () => {
  await srv.ensure()
  sbx = srv.track(await Sandbox.create('base', { envs: { SBX_ENV: 'from-create', SHARED: 'create' }, timeoutMs: 300000 }))
})

test('stdout, stderr and exit code 0', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2; printf "x%.0s" 1 2 3')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\nxxx')
  assert.equal(r.stderr, 'err\n')
})

test('streaming callbacks see the output', async () => {
  const out = []
  const err = []
  const r = await sbx.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done', {
    onStdout: (d) => out.push(d),
    onStderr: (d) => err.push(d),
  })
  assert.equal(out.join(''), 'o1\no2\no3\n')
  assert.equal(err.join(''), 'e1\ne2\ne3\n')
  assert.equal(r.stdout, 'o1\no2\no3\n')
})

test('non-zero exit throws CommandExitError with exitCode/stdout/stderr', async () => {
  await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 7'), (e) => {
    assert.ok(e instanceof CommandExitError, `got ${e && e.constructor && e.constructor.name}: ${e}`)
    assert.equal(e.exitCode, 7)
    assert.equal(e.stdout, 'partial\n')
    assert.equal(e.stderr, 'bad\n')
    return true
  })
})

test('envs: sandbox-level and per-command, per-command wins', async () => {
  const r = await sbx.commands.run('echo "$SBX_ENV|$SHARED|$CMD_ENV"', { envs: { CMD_ENV: 'cmd', SHARED: 'command' } })
  assert.equal(r.stdout, 'from-create|command|cmd\n')
})

test('cwd', async () => {
  const r = await sbx.commands.run('pwd', { cwd: '/tmp' })
  assert.equal(r.stdout, '/tmp\n')
  const home = await sbx.commands.run('pwd')
  assert.equal(home.stdout, '/home/user\n')
})

test('default user is "user" (1000), root on request', async () => {
  const def = await sbx.commands.run('whoami; id -u; echo $HOME')
  assert.equal(def.stdout, 'user\n1000\n/home/user\n')
  const root = await sbx.commands.run('whoami; id -u; echo $HOME', { user: 'root' })
  assert.equal(root.stdout, 'root\n0\n/root\n')
  const explicit = await sbx.commands.run('id -u', { user: 'user' })
  assert.equal(explicit.stdout, '1000\n')
})

test('login shell PATH finds standard tools', async () => {
  const r = await sbx.commands.run('command -v ls cat sleep | wc -l; echo $PATH')
  assert.equal(r.stdout.split('\n')[0].trim(), '3')
  assert.match(r.stdout, /\/usr\/bin/)
})

test('timeoutMs ends a long command with TimeoutError', async () => {
  const t0 = Date.now()
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1500 }), (e) => {
    assert.ok(e instanceof TimeoutError, `got ${e && e.constructor && e.constructor.name}: ${e}`)
    return true
  })
  assert.ok(Date.now() - t0 < 15000)
})

test('background process: list, connect by pid, kill', async () => {
  const h = await sbx.commands.run('echo started; sleep 300', { background: true })
  assert.ok(h.pid > 0)
  await waitFor(() => h.stdout.includes('started'), { timeoutMs: 10000, what: 'background stdout' })

  const procs = await sbx.commands.list()
  const mine = procs.find((p) => p.pid === h.pid)
  assert.ok(mine, `pid ${h.pid} in list ${JSON.stringify(procs.map((p) => p.pid))}`)
  assert.equal(mine.cmd, '/bin/bash')
  assert.ok(mine.args.includes('echo started; sleep 300'))

  const seen = []
  const c = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d), timeoutMs: 0 })
  assert.equal(c.pid, h.pid)

  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, `got ${e}`)
    assert.notEqual(e.exitCode, 0)
    return true
  })
  await assert.rejects(c.wait(), CommandExitError)
  await waitFor(async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid), {
    timeoutMs: 10000,
    what: 'killed process to leave the list',
  })
  assert.equal(await sbx.commands.kill(h.pid), false, 'killing an unknown pid returns false')
})

test('connect to a background process streams later output', async () => {
  const h = await sbx.commands.run('sleep 1; echo late; sleep 0.5; exit 3', { background: true })
  const seen = []
  const c = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
  await assert.rejects(c.wait(), (e) => e instanceof CommandExitError && e.exitCode === 3)
  assert.match(seen.join(''), /late/)
})

test('sendStdin feeds a process started with stdin:true', async () => {
  const h = await sbx.commands.run('read a; read b; echo "got:$a:$b"', { background: true, stdin: true })
  await sleep(200)
  await sbx.commands.sendStdin(h.pid, 'one\n')
  await h.sendStdin('two\n')
  const r = await h.wait()
  assert.equal(r.stdout, 'got:one:two\n')
})

test('closeStdin ends input', async () => {
  const h = await sbx.commands.run('cat; echo eof', { background: true, stdin: true })
  await h.sendStdin('abc\n')
  await sleep(200)
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout, 'abc\neof\n')
})

test('a large output arrives intact', async () => {
  const r = await sbx.commands.run('head -c 3000000 /dev/zero | tr "\\0" a')
  assert.equal(r.stdout.length, 3000000)
  assert.ok(/^a+$/.test(r.stdout))
})
