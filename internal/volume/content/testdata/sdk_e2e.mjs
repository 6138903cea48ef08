// Drives the volume-content handler with the unmodified e2b JS SDK.
// Env: E2B_MODULE (path to e2b/dist/index.mjs), E2B_VOLUME_API_URL,
// VOLUME_ID, VOLUME_TOKEN. Exits non-zero on the first failed check.
import { pathToFileURL } from 'node:url'

const { Volume, VolumePathNotFoundError, VolumeError } = await import(pathToFileURL(process.env.E2B_MODULE).href)

function check(cond, msg) {
  if (!cond) throw new Error('check failed: ' + msg)
}

async function throws(fn, cls, msg) {
  try {
    await fn()
  } catch (err) {
    check(err instanceof cls, `${msg}: got ${err?.constructor?.name}: ${err?.message}`)
    return err
  }
  throw new Error(`check failed: ${msg}: did not throw`)
}

const vol = new Volume(process.env.VOLUME_ID, 'e2e', process.env.VOLUME_TOKEN)

// writeFile / readFile (text, bytes, blob, stream)
let e = await vol.writeFile('/hello.txt', 'hi there')
check(e.type === 'file' && e.size === 8 && e.path === '/hello.txt' && e.name === 'hello.txt', 'writeFile entry ' + JSON.stringify(e))
check(e.mtime instanceof Date && !isNaN(e.mtime.getTime()), 'mtime is a Date')
check((await vol.readFile('/hello.txt')) === 'hi there', 'readFile text')
const bytes = await vol.readFile('/hello.txt', { format: 'bytes' })
check(bytes instanceof Uint8Array && bytes.length === 8, 'readFile bytes')
const blob = await vol.readFile('/hello.txt', { format: 'blob' })
check((await blob.text()) === 'hi there', 'readFile blob')

// Streamed (chunked) upload of 5 MiB, read back as a stream.
const size = 5 << 20
let sent = 0
const stream = new ReadableStream({
  pull(ctrl) {
    if (sent >= size) return ctrl.close()
    const n = Math.min(64 << 10, size - sent)
    const chunk = new Uint8Array(n)
    for (let i = 0; i < n; i++) chunk[i] = (sent + i) % 251
    sent += n
    ctrl.enqueue(chunk)
  },
})
e = await vol.writeFile('/big/stream.bin', stream, { force: true, mode: 0o600, uid: 1000, gid: 1000 })
check(e.size === size && e.mode === 0o600 && e.uid === 1000 && e.gid === 1000, 'stream writeFile entry ' + JSON.stringify(e))
let got = 0
let ok = true
for await (const chunk of await vol.readFile('/big/stream.bin', { format: 'stream' })) {
  for (let i = 0; i < chunk.length; i++) if (chunk[i] !== (got + i) % 251) ok = false
  got += chunk.length
}
check(ok && got === size, `stream readFile ${got} bytes, content ok=${ok}`)

await throws(() => vol.writeFile('/no/parent/f', 'x'), VolumePathNotFoundError, 'writeFile without parent')
await throws(() => vol.readFile('/nope'), VolumePathNotFoundError, 'readFile missing')

// makeDir
e = await vol.makeDir('/a')
check(e.type === 'directory' && e.path === '/a', 'makeDir ' + JSON.stringify(e))
e = await vol.makeDir('/a/b/c', { force: true, mode: 0o700 })
check(e.type === 'directory' && e.mode === 0o700, 'makeDir force ' + JSON.stringify(e))
await throws(() => vol.makeDir('/a'), VolumeError, 'makeDir existing')
await throws(() => vol.makeDir('/x/y'), VolumePathNotFoundError, 'makeDir without parent')

// list
let names = (await vol.list('/')).map((x) => x.path).join(',')
check(names === '/a,/big,/hello.txt', 'list depth 1: ' + names)
names = (await vol.list('/', { depth: 2 })).map((x) => x.path).join(',')
check(names === '/a,/a/b,/big,/big/stream.bin,/hello.txt', 'list depth 2: ' + names)
await throws(() => vol.list('/nope'), VolumePathNotFoundError, 'list missing')

// getInfo / exists / updateMetadata
e = await vol.getInfo('/a/b/c')
check(e.type === 'directory' && e.name === 'c', 'getInfo ' + JSON.stringify(e))
check(await vol.exists('/hello.txt'), 'exists true')
check(!(await vol.exists('/nope')), 'exists false')
e = await vol.updateMetadata('/hello.txt', { mode: 0o640, uid: 1234, gid: 4321 })
check(e.mode === 0o640 && e.uid === 1234 && e.gid === 4321, 'updateMetadata ' + JSON.stringify(e))
e = await vol.updateMetadata('/hello.txt', { mode: 0o604 })
check(e.mode === 0o604 && e.uid === 1234, 'updateMetadata partial ' + JSON.stringify(e))
await throws(() => vol.updateMetadata('/nope', { mode: 0o600 }), VolumePathNotFoundError, 'updateMetadata missing')

// remove
await vol.remove('/hello.txt')
check(!(await vol.exists('/hello.txt')), 'removed file')
await vol.remove('/a')
check(!(await vol.exists('/a/b/c')), 'removed dir')
await throws(() => vol.remove('/a'), VolumePathNotFoundError, 'remove missing')

// auth
const bad = new Volume(process.env.VOLUME_ID, 'e2e', 'wrong-token')
const err = await throws(() => bad.getInfo('/'), Error, 'bad token')
check(!(err instanceof VolumePathNotFoundError), 'bad token is not a not-found')

console.log('e2e ok')
