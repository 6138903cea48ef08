'use strict'
// 100 MB upload + download, streamed both ways, compared by sha256.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { Readable } = require('node:stream')
const { Sandbox } = require('e2b')
const { setup } = require('./harness')

const srv = setup(test)
const SIZE = 100 * 1024 * 1024
let sbx, tmpDir, src, srcHash

test.before(async () => {
  await srv.ensure()
  sbx = srv.track(await Sandbox.create('base', { timeoutMs: 600000 }))
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cubicle-big-'))
  src = path.join(tmpDir, 'src.bin')
  // Pseudo-random, incompressible data, written in 1 MiB chunks.
  const fd = fs.openSync(src, 'w')
  const h = crypto.createHash('sha256')
  for (let off = 0; off < SIZE; off += 1 << 20) {
    const chunk = crypto.randomBytes(1 << 20)
    h.update(chunk)
    fs.writeSync(fd, chunk)
  }
  fs.closeSync(fd)
  srcHash = h.digest('hex')
})

test.after(() => {
  if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true })
})

test('upload 100 MB as a stream, verify inside, download as a stream', { timeout: 300000 }, async () => {
  const t0 = Date.now()
  const info = await sbx.files.write('/home/user/big.bin', Readable.toWeb(fs.createReadStream(src, { highWaterMark: 1 << 20 })), {
    requestTimeoutMs: 240000,
  })
  const tUp = Date.now() - t0
  assert.equal(info.path, '/home/user/big.bin')

  const r = await sbx.commands.run('stat -c %s /home/user/big.bin; sha256sum /home/user/big.bin', { timeoutMs: 120000 })
  const [size, sum] = r.stdout.trim().split('\n')
  assert.equal(Number(size), SIZE)
  assert.equal(sum.split(/\s+/)[0], srcHash, 'sha256 inside the sandbox')

  const t1 = Date.now()
  const stream = await sbx.files.read('/home/user/big.bin', { format: 'stream', requestTimeoutMs: 240000 })
  const h = crypto.createHash('sha256')
  let n = 0
  for await (const chunk of stream) {
    h.update(chunk)
    n += chunk.length
  }
  const tDown = Date.now() - t1
  assert.equal(n, SIZE)
  assert.equal(h.digest('hex'), srcHash, 'sha256 of the download')
  console.log(`# 100 MB upload ${tUp} ms, download ${tDown} ms`)
})

test('upload as octet-stream from a Blob-free ArrayBuffer (10 MB) and gzip read', { timeout: 120000 }, async () => {
  const buf = crypto.randomBytes(10 * 1024 * 1024)
  await sbx.files.write('/tmp/ten.bin', buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length), { useOctetStream: true })
  const back = await sbx.files.read('/tmp/ten.bin', { format: 'bytes', gzip: true })
  assert.equal(crypto.createHash('sha256').update(back).digest('hex'), crypto.createHash('sha256').update(buf).digest('hex'))
})
