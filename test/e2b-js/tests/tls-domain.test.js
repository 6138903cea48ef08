'use strict'
// E2B_DOMAIN alone, over TLS: `serve --tls-self-signed --listen-tls ADDR:443`
// serves https://api.<domain> and https://<port>-<id>.<domain> on one port.
// The SDK runs as a child in a network namespace this test creates, whose
// /etc/hosts (iproute2 binds /etc/netns/<ns>/hosts over it) maps the names to
// the server, so neither DNS nor the machine's /etc/hosts is touched. The
// child has E2B_DOMAIN and E2B_API_KEY only: no E2B_API_URL/E2B_SANDBOX_URL.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const path = require('node:path')
const { spawnSync, execFileSync } = require('node:child_process')
const { setup, DOMAIN } = require('./harness')

const tag = crypto.randomBytes(3).toString('hex')
const ns = `cbtls${tag}`
const veth = `cbtl${tag}`
const third = crypto.randomInt(0, 64) * 4 // a /30 in 198.19.<n>.0/24 (benchmark range, never routed)
const second = crypto.randomInt(0, 256)
const hostAddr = `198.19.${second}.${third + 1}`
const nsAddr = `198.19.${second}.${third + 2}`
const etcDir = `/etc/netns/${ns}`

function ip(...args) {
  execFileSync('ip', args, { stdio: 'pipe', timeout: 15000 })
}

test.before(() => {
  ip('netns', 'add', ns)
  ip('link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns)
  ip('addr', 'add', `${hostAddr}/30`, 'dev', veth)
  ip('link', 'set', veth, 'up')
  ip('-n', ns, 'addr', 'add', `${nsAddr}/30`, 'dev', 'eth0')
  ip('-n', ns, 'link', 'set', 'eth0', 'up')
  ip('-n', ns, 'link', 'set', 'lo', 'up')
  fs.mkdirSync(etcDir, { recursive: true })
  fs.writeFileSync(path.join(etcDir, 'hosts'), `127.0.0.1 localhost\n${hostAddr} api.${DOMAIN}\n`)
})

const srv = setup(test, ['--tls-self-signed', '--listen-tls', `${hostAddr}:443`])

test.after(() => {
  spawnSync('ip', ['link', 'del', veth], { stdio: 'ignore', timeout: 15000 })
  spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore', timeout: 15000 })
  fs.rmSync(etcDir, { recursive: true, force: true })
})

// A WebSocket echo server for the sandbox (python3's standard library only):
// text and binary frames under 126 bytes are echoed, close answers close.
const wsServer = String.raw`
import base64, hashlib, socket, threading
def rd(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def serve(c):
    h = b""
    while b"\r\n\r\n" not in h:
        d = c.recv(4096)
        if not d:
            return
        h += d
    key = [l.split(b":", 1)[1].strip() for l in h.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        b0, b1 = rd(c, 2)
        n = b1 & 127
        if n == 126:
            n = int.from_bytes(rd(c, 2), "big")
        elif n == 127:
            n = int.from_bytes(rd(c, 8), "big")
        m = rd(c, 4) if b1 & 128 else bytes(4)
        p = bytes(x ^ m[i % 4] for i, x in enumerate(rd(c, n)))
        op = b0 & 15
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        if op in (1, 2) and len(p) < 126:
            c.sendall(bytes([0x80 | op, len(p)]) + p)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8001))
s.listen(8)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// An HTTPS server for the sandbox's port 8443 (listed in httpsPorts): the
// proxy ends the client's TLS and re-encrypts to it; its certificate is
// self-signed, which the proxy accepts as e2b documents.
const tlsServer = String.raw`
import http.server as h, ssl
class H(h.BaseHTTPRequestHandler):
    def do_GET(s):
        b = ("tls " + s.headers.get("Host", "")).encode()
        s.send_response(200); s.send_header("Content-Length", str(len(b))); s.end_headers(); s.wfile.write(b)
    def log_message(s, *a): pass
srv = h.HTTPServer(("0.0.0.0", 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/home/user/backend.pem", "/home/user/backend-key.pem")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
`

// The child: what a user's program does with E2B_DOMAIN set. It adds each
// sandbox's hosts to its namespace's /etc/hosts (a wildcard DNS record's job).
const child = `
const fs = require('node:fs')
const { Sandbox } = require('e2b')
const domain = process.env.E2B_DOMAIN
const addHosts = (id, ports) => fs.appendFileSync('/etc/hosts', ports.map((p) => process.env.SERVER_ADDR + ' ' + p + '-' + id + '.' + domain + '\\n').join(''))
;(async () => {
  const out = {}
  const sbx = await Sandbox.create('base', { timeoutMs: 120000, network: { maskRequestHost: 'app.local:\${PORT}', httpsPorts: [8443] } })
  addHosts(sbx.sandboxId, [49983, 8000, 8001, 8443])
  try {
    out.echo = (await sbx.commands.run('echo over-tls')).stdout.trim()
    await sbx.files.write('/home/user/tls.txt', 'written over tls')
    out.read = await sbx.files.read('/home/user/tls.txt')
    await sbx.commands.run(${JSON.stringify(`python3 -c '
import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(s):
        b = s.headers.get("Host", "").encode()
        s.send_response(200); s.send_header("Content-Length", str(len(b))); s.end_headers(); s.wfile.write(b)
    def log_message(s, *a): pass
h.HTTPServer(("0.0.0.0", 8000), H).serve_forever()'`)}, { background: true })
    out.host = sbx.getHost(8000)
    for (let i = 0; i < 50; i++) {
      try {
        const res = await fetch('https://' + out.host + '/')
        if (res.status === 200) { out.served = await res.text(); break }
      } catch (e) { out.fetchErr = String(e.cause || e) }
      await new Promise((r) => setTimeout(r, 200))
    }
    // A WebSocket through wss://<port>-<id>.<domain> (undici's client, as in
    // browsers and Node 22's global WebSocket).
    await sbx.files.write('/home/user/ws.py', process.env.WS_SERVER_PY)
    await sbx.commands.run('python3 /home/user/ws.py', { background: true })
    const { WebSocket } = require('undici')
    for (let i = 0; i < 50 && out.wsEcho === undefined; i++) {
      out.wsEcho = await new Promise((resolve) => {
        const ws = new WebSocket('wss://' + sbx.getHost(8001) + '/echo')
        ws.onopen = () => ws.send('ping over wss')
        ws.onmessage = (ev) => { resolve(String(ev.data)); ws.close() }
        ws.onerror = (ev) => { out.wsErr = String(ev.error || ev.message || 'error'); resolve(undefined) }
      })
      if (out.wsEcho === undefined) await new Promise((r) => setTimeout(r, 200))
    }
    // httpsPorts: the service on 8443 speaks TLS itself.
    await sbx.files.write('/home/user/backend.pem', process.env.BACKEND_CERT)
    await sbx.files.write('/home/user/backend-key.pem', process.env.BACKEND_KEY)
    await sbx.files.write('/home/user/tls_server.py', process.env.TLS_SERVER_PY)
    await sbx.commands.run('python3 /home/user/tls_server.py', { background: true })
    for (let i = 0; i < 50; i++) {
      try {
        const res = await fetch('https://' + sbx.getHost(8443) + '/')
        if (res.status === 200) { out.tlsServed = await res.text(); break }
        out.tlsStatus = res.status
      } catch (e) { out.tlsErr = String(e.cause || e) }
      await new Promise((r) => setTimeout(r, 200))
    }
    out.httpsPorts = (await sbx.getInfo()).network?.httpsPorts
    out.listed = (await Sandbox.list().nextItems()).some((s) => s.sandboxId === sbx.sandboxId)
  } finally {
    out.killed = await sbx.kill()
  }
  console.log(JSON.stringify(out))
})().catch((e) => { console.error(e && e.stack || e); process.exit(1) })
`

test('E2B_DOMAIN only: create, commands, files, getHost(port) over https and a WebSocket over wss', { timeout: 180000 }, async () => {
  const ca = path.join(srv.dataDir, 'tls', 'ca.pem')
  // A self-signed certificate for the sandbox's own HTTPS service.
  const backendDir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'cbtls-backend-'))
  test.after(() => fs.rmSync(backendDir, { recursive: true, force: true }))
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', path.join(backendDir, 'key.pem'), '-out', path.join(backendDir, 'cert.pem'), '-days', '1', '-subj', '/CN=sandbox'], { stdio: 'ignore', timeout: 15000 })
  assert.ok(fs.existsSync(ca), 'serve made its local CA')
  const env = {
    PATH: process.env.PATH,
    HOME: process.env.HOME || '/root',
    E2B_DOMAIN: DOMAIN,
    E2B_API_KEY: srv.apiKey,
    NODE_EXTRA_CA_CERTS: ca,
    SERVER_ADDR: hostAddr,
    WS_SERVER_PY: wsServer,
    TLS_SERVER_PY: tlsServer,
    BACKEND_CERT: fs.readFileSync(path.join(backendDir, 'cert.pem'), 'utf8'),
    BACKEND_KEY: fs.readFileSync(path.join(backendDir, 'key.pem'), 'utf8'),
  }
  const r = spawnSync('ip', ['netns', 'exec', ns, process.execPath, '-e', child], {
    cwd: path.join(__dirname, '..'),
    env,
    encoding: 'utf8',
    timeout: 150000,
  })
  assert.equal(r.status, 0, `child failed (${r.status}):\n${r.stderr}\n${r.stdout}`)
  const out = JSON.parse(r.stdout.trim().split('\n').pop())
  assert.equal(out.echo, 'over-tls')
  assert.equal(out.read, 'written over tls')
  assert.match(out.host, new RegExp(`^8000-[a-z0-9]{20}\\.${DOMAIN.replace('.', '\\.')}$`))
  // The service behind getHost(8000) answered over https and saw the masked Host.
  assert.equal(out.served, 'app.local:8000', JSON.stringify(out))
  assert.equal(out.wsEcho, 'ping over wss', JSON.stringify(out))
  // httpsPorts: reached over TLS (the mask applies there too), and reported back.
  assert.equal(out.tlsServed, 'tls app.local:8443', JSON.stringify(out))
  assert.deepEqual(out.httpsPorts, [8443])
  assert.equal(out.listed, true)
  assert.equal(out.killed, true)
})
