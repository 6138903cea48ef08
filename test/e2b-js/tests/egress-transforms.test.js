'use strict'
// Request transforms (network.rules) with Secret placeholders, and a SOCKS5
// egressProxy, through the unmodified SDK: a real sandbox, the node's egress
// proxy, and test/testnet (bin/cubicle-testnet: a netns on 198.18.128.0/17
// answering every *.test name, echo servers, and a SOCKS5 server that needs
// alice/pw and can be stopped) as the internet.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const path = require('node:path')
const readline = require('node:readline')
const { spawn } = require('node:child_process')
const { Sandbox, Secret, ALL_TRAFFIC } = require('e2b')
const { setup } = require('./harness')

const extra = []
let net = null
let fixture = null
let lines = null
const ready = new Promise((resolve, reject) => {
  fixture = spawn(path.join(__dirname, '..', '..', '..', 'bin', 'cubicle-testnet'), ['--socks-user', 'alice', '--socks-pass', 'pw'], { stdio: ['pipe', 'pipe', 'inherit'] })
  fixture.once('exit', (code) => reject(new Error(`cubicle-testnet exited ${code}`)))
  lines = readline.createInterface({ input: fixture.stdout })[Symbol.asyncIterator]()
  lines.next().then(({ value }) => {
    net = JSON.parse(value)
    extra.push('--dns', net.dns, '--ca-certificates', net.caBundle)
    resolve()
  }, reject)
})
ready.catch(() => {})
const srv = setup({ before: (fn) => test.before(async () => { await ready; await fn() }), after: (fn) => test.after(fn) }, extra)
test.after(async () => {
  if (!fixture) return
  const exited = new Promise((resolve) => fixture.once('exit', resolve))
  fixture.stdin.end() // it removes its netns, veth and files
  await exited
})

// control sends one line to the fixture ("socks stop") and returns its answer.
async function control(line) {
  fixture.stdin.write(line + '\n')
  const { value } = await lines.next()
  return value
}

async function curl(sbx, args) {
  const r = await sbx.commands.run(`curl -sS -m 5 ${args} || true`)
  return r.stdout.trim()
}

// status of a GET from inside the sandbox; '000' when the connection failed.
async function status(sbx, url) {
  return curl(sbx, `-o /dev/null -w '%{http_code}' ${url}`)
}

const sha256 = (s) => crypto.createHash('sha256').update(s).digest('hex')

test('a rules transform injects a header the server sees; a Secret placeholder is filled by the proxy and never enters the sandbox', { timeout: 180000 }, async () => {
  const value = `sv-${crypto.randomBytes(12).toString('hex')}`
  const name = `api-key-${Date.now()}`
  await Secret.create(name, value)
  const sbx = await Sandbox.create('base', {
    network: {
      allowOut: ({ rules }) => [...rules.keys(), 'plain.test'],
      denyOut: [ALL_TRAFFIC],
      rules: {
        'API.test': [{ transform: { headers: { 'X-Api-Key': Secret.fill(name), 'X-Team': 'cubicle' } } }],
      },
    },
  })
  try {
    // The echo answers only a hash of the header, so the value is never sent
    // back into the sandbox either.
    const out = JSON.parse(await curl(sbx, `'https://api.test/?sha256=X-Api-Key' -H 'X-Api-Key: from-the-sandbox'`))
    assert.equal(out.sha256, sha256(value), 'the server got the secret in place of the sandbox\'s header')
    const team = JSON.parse(await curl(sbx, 'https://api.test/'))
    assert.deepEqual(team.headers['X-Team'], ['cubicle'])
    assert.equal(team.sni, 'api.test')
    // Hosts without rules are not intercepted: the real certificate.
    const plain = JSON.parse(await curl(sbx, 'https://plain.test/'))
    assert.equal(plain.headers['X-Team'], undefined)

    // The value is nowhere in the sandbox: env, every process's environ and
    // cmdline, and the files. The command names it in two halves, joined
    // in a shell variable and handed to grep through a pipe, so the search
    // itself puts it in no cmdline, environ or file.
    const half = value.length / 2
    const grep = await sbx.commands.run(
      `a='${value.slice(0, half)}'; b='${value.slice(half)}'; v="$a$b"; ` +
        `env | grep -cF -f <(printf %s "$v"); cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -acF -f <(printf %s "$v"); ` +
        `grep -rlsaF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -f <(printf %s "$v") / | head -5; true`,
      { user: 'root', timeoutMs: 120000 },
    )
    assert.equal(grep.stdout.trim(), '0\n0', `found the secret in the sandbox: ${grep.stdout}`)

    const info = await srv.api('GET', `/sandboxes/${sbx.sandboxId}`)
    assert.deepEqual(info.json.network.rules, { 'api.test': [{ transform: { headers: { 'X-Api-Key': `\${e2b.secrets.${name}}`, 'X-Team': 'cubicle' } } }] }, info.text)

    // updateNetwork replaces the rules; a rotated secret applies to the next request.
    await Secret.update(name, value + '-rotated')
    await sbx.updateNetwork({ allowOut: ['api.test'], denyOut: [ALL_TRAFFIC], rules: { 'api.test': [{ transform: { headers: { 'X-Api-Key': `v2 ${Secret.fill(name)}` } } }] } })
    const rotated = JSON.parse(await curl(sbx, `'https://api.test/?sha256=X-Api-Key'`))
    assert.equal(rotated.sha256, sha256(`v2 ${value}-rotated`))
    await sbx.updateNetwork({ allowOut: ['api.test'], denyOut: [ALL_TRAFFIC] })
    const none = JSON.parse(await curl(sbx, `'https://api.test/?sha256=X-Api-Key'`))
    assert.equal(none.present, false, 'rules cleared by an update that leaves them out')
  } finally {
    await sbx.kill()
    await Secret.destroy(name)
  }
})

test('only a sandbox whose policy has rules trusts the interception CA; updateNetwork adding rules installs it first', { timeout: 180000 }, async () => {
  const fs = require('node:fs')
  // The CA's body lines, as a fixed string that grep can look for.
  const pem = fs.readFileSync(path.join(srv.dataDir, 'egress-ca', 'ca.pem'), 'utf8')
  const line = pem.split('\n')[1]
  assert.match(line, /^[A-Za-z0-9+/]{64}$/)
  const trusts = async (sbx) => {
    const r = await sbx.commands.run(
      `grep -cF '${line}' /etc/ssl/certs/ca-certificates.crt; test -e /usr/local/share/ca-certificates/cubicle-egress.crt && echo file || echo none`,
      { user: 'root' },
    ).catch((e) => e.result ?? e)
    return r.stdout.trim()
  }
  const sbx = await Sandbox.create('base', { network: { allowOut: ['api.test'], denyOut: [ALL_TRAFFIC] } })
  try {
    assert.equal(await trusts(sbx), '0\nnone', 'a sandbox without rules trusts the interception CA')
    // Hosts without rules are not intercepted, so TLS still verifies.
    assert.equal(await status(sbx, 'https://api.test/'), '200')

    await sbx.updateNetwork({ allowOut: ['api.test'], denyOut: [ALL_TRAFFIC], rules: { 'api.test': [{ transform: { headers: { 'X-Team': 'late' } } }] } })
    assert.equal(await trusts(sbx), '1\nfile')
    // curl verifies the intercepted certificate against the bundle.
    const e = JSON.parse(await curl(sbx, 'https://api.test/'))
    assert.deepEqual(e.headers['X-Team'], ['late'])
    // Idempotent: another update with rules adds nothing.
    await sbx.updateNetwork({ allowOut: ['api.test'], denyOut: [ALL_TRAFFIC], rules: { 'api.test': [{ transform: { headers: { 'X-Team': 'again' } } }] } })
    assert.equal(await trusts(sbx), '1\nfile')
  } finally {
    await sbx.kill()
  }
  // Created with rules: trusted from the first command.
  const ruled = await Sandbox.create('base', { network: { allowOut: ['api.test'], denyOut: [ALL_TRAFFIC], rules: { 'api.test': [{ transform: { headers: { 'X-Team': 'first' } } }] } } })
  try {
    assert.equal(await trusts(ruled), '1\nfile')
  } finally {
    await ruled.kill()
  }
})

test('a rule naming a secret that is then deleted answers 502 and forwards nothing', { timeout: 120000 }, async () => {
  const name = `gone-${Date.now()}`
  await Secret.create(name, 'v')
  const sbx = await Sandbox.create('base', { network: { allowOut: ['api.test'], denyOut: [ALL_TRAFFIC], rules: { 'api.test': [{ transform: { headers: { Authorization: Secret.fill(name) } } }] } } })
  try {
    await Secret.destroy(name)
    assert.equal(await status(sbx, 'https://api.test/'), '502')
  } finally {
    await sbx.kill()
  }
})

test('egressProxy: all TCP goes through the SOCKS5 upstream, and fails closed when it stops', { timeout: 180000 }, async () => {
  const sbx = await Sandbox.create('base', { network: { egressProxy: { address: net.socks, username: 'alice', password: 'pw' } } })
  try {
    // Through the SOCKS server the echo sees the fixture's own address.
    for (const url of ['http://a.test/', 'https://a.test/', 'http://a.test:8080/']) {
      const e = JSON.parse(await curl(sbx, url))
      assert.ok(e.remote.startsWith(net.addr + ':'), `${url} came from ${e.remote}, not through the proxy`)
    }
    // Its DNS is answered by the node with a stand-in address, which the
    // proxy dials by name through the upstream; the resolver sees nothing.
    const queries = await control('dns queries')
    const hosts = (await sbx.commands.run('getent ahostsv4 a.test || true')).stdout.trim()
    assert.match(hosts, /^198\.18\.[0-9]+\.[0-9]+ /, hosts)
    assert.ok(!hosts.startsWith(net.addr + ' '), `a.test resolved to the real address: ${hosts}`)
    assert.equal(await control('dns queries'), queries, 'the sandbox\'s DNS query reached the resolver')
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.deepEqual(info.network.egressProxy, { address: net.socks, username: 'alice' }, 'the password is never returned')
    const raw = await srv.api('GET', `/sandboxes/${sbx.sandboxId}`)
    assert.ok(!raw.text.includes('"pw"'), raw.text)

    assert.equal(await control('socks stop'), 'ok')
    for (const url of ['http://a.test/', 'https://a.test/', 'http://a.test:8080/', `http://${net.addr}:8080/`]) {
      assert.equal(await status(sbx, url), '000', `${url} with the proxy down`)
    }
    assert.equal(await control('socks start'), 'ok')
    assert.equal(await status(sbx, 'http://a.test/'), '200')

    // An update that leaves egressProxy out stops tunnelling.
    await sbx.updateNetwork({})
    const direct = JSON.parse(await curl(sbx, 'http://a.test/'))
    assert.ok(direct.remote.startsWith(net.hostAddr + ':'), `direct after the update: ${direct.remote}`)
  } finally {
    await sbx.kill()
  }
})

test('bad egressProxy and rules input is a 400 naming the field', async () => {
  for (const [network, field] of [
    [{ egressProxy: { address: 'http://proxy.test:1080' } }, 'network.egressProxy.address'],
    [{ egressProxy: { address: 'proxy.test' } }, 'network.egressProxy.address'],
    [{ egressProxy: { address: '127.0.0.1:1080' } }, 'network.egressProxy.address'],
    [{ egressProxy: { address: 'p.test:1080', password: 'x' } }, 'network.egressProxy.password'],
    [{ rules: { '*': [{ transform: { headers: { A: 'b' } } }] } }, 'network.rules'],
    [{ rules: { 'a.test': [{ transform: { headers: { Host: 'b' } } }] } }, 'network.rules'],
    [{ rules: { 'a.test': [{ transform: { headers: { A: '${e2b.identity.tokens.aws}' } } }] } }, 'network.rules'],
  ]) {
    const r = await srv.api('POST', '/sandboxes', { body: { templateID: 'base', network } })
    assert.equal(r.status, 400, `${JSON.stringify(network)}: ${r.text}`)
    assert.equal(r.json.code, 400)
    assert.ok(r.json.message.includes(field), `${JSON.stringify(network)}: ${r.json.message}`)
  }
})
