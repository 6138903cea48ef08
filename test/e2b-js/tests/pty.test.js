'use strict'
// PTY: create, sendInput, resize, output, kill.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, CommandExitError } = require('e2b')
const { setup, waitFor } = require('./harness')

const srv = setup(test)
let sbx

test.before(async () => {
  await srv.ensure()
  sbx = srv.track(await Sandbox.create('base', { timeoutMs: 300000 }))
})

test('pty: interactive shell echoes input, reports size, resizes, is killed', async () => {
  const chunks = []
  const dec = new TextDecoder()
  const output = () => chunks.join('')
  const term = await sbx.pty.create({
    cols: 80,
    rows: 24,
    timeoutMs: 0,
    onData: (d) => chunks.push(dec.decode(d, { stream: true })),
  })
  assert.ok(term.pid > 0)
  const enc = new TextEncoder()

  await sbx.pty.sendInput(term.pid, enc.encode('echo "hello-$((6*7))"\n'))
  await waitFor(() => output().includes('hello-42'), { timeoutMs: 10000, what: `pty output hello-42; got ${JSON.stringify(output())}` })

  // It's a real terminal: tty says /dev/pts/N and stty sees the size we asked for.
  await sbx.pty.sendInput(term.pid, enc.encode('tty; stty size; echo "TERM=$TERM"\n'))
  await waitFor(() => /24 80/.test(output()) && /TERM=xterm-256color/.test(output()), {
    timeoutMs: 10000,
    what: `stty size 24 80; got ${JSON.stringify(output())}`,
  })
  assert.match(output(), /\/dev\/pts\/\d+/)

  await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'))
  await waitFor(() => /40 120/.test(output()), { timeoutMs: 10000, what: `stty size 40 120 after resize; got ${JSON.stringify(output())}` })

  // The pty shows up in the process list.
  const procs = await sbx.commands.list()
  assert.ok(procs.some((p) => p.pid === term.pid), 'pty process listed')

  assert.equal(await sbx.pty.kill(term.pid), true)
  await assert.rejects(term.wait(), CommandExitError)
  await waitFor(async () => !(await sbx.commands.list()).some((p) => p.pid === term.pid), { timeoutMs: 10000, what: 'pty gone from list' })
})

test('pty: exit ends the session with its code', async () => {
  const chunks = []
  const term = await sbx.pty.create({ cols: 40, rows: 10, timeoutMs: 30000, onData: (d) => chunks.push(Buffer.from(d)) })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 5\n'))
  await assert.rejects(term.wait(), (e) => e instanceof CommandExitError && e.exitCode === 5)
})

test('pty as root', async () => {
  const chunks = []
  const term = await sbx.pty.create({ cols: 80, rows: 24, user: 'root', timeoutMs: 30000, onData: (d) => chunks.push(Buffer.from(d).toString()) })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo "uid=$(id -u)"; exit 0\n'))
  const r = await term.wait()
  assert.equal(r.exitCode, 0)
  assert.match(chunks.join(''), /uid=0/)
})
