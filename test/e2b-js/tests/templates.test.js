'use strict'
// Template builds through the unmodified SDK: Template.build of an image-only
// recipe and of a copy/run/env/user/workdir recipe, Sandbox.create(alias),
// a failing RUN reported with its step, and a failed rebuild keeping the
// previous image.
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { Sandbox, Template, BuildError } = require('e2b')
const { setup, REPO, IMAGES_DIR } = require('./harness')

const srv = setup(test)
const CUBICLE = process.env.CUBICLE_BIN || path.join(REPO, 'bin', 'cubicle')
const BASE_IMAGE = 'cubicle/pybase:1'
const uniq = () => `${Date.now().toString(36)}${Math.floor(Math.random() * 1e4)}`

test.before(async () => {
  await srv.ensure()
  // The image store has no registry to pull from here: import a rootfs (the
  // small busybox one: these tests are about the pipeline, not the distro).
  execFileSync(CUBICLE, ['image', 'import', BASE_IMAGE, path.join(IMAGES_DIR, 'mini', 'rootfs')], {
    env: { ...process.env, CUBICLE_API_URL: srv.url, CUBICLE_API_KEY: srv.apiKey },
    timeout: 120000,
  })
})

test('Template.build of an image-only recipe; Sandbox.create(alias) gets its sizes', { timeout: 300000 }, async () => {
  const name = `imgonly-${uniq()}`
  const logs = []
  const info = await Template.build(Template().fromImage(BASE_IMAGE), name, { cpuCount: 1, memoryMB: 256, onBuildLogs: (l) => logs.push(l) })
  assert.match(info.templateId, /^tpl_[0-9a-f]{8}$/)
  assert.match(info.buildId, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'build IDs are UUIDs, as the SDKs parse them')
  assert.ok(logs.length > 0, 'build logs streamed')
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists(`nope-${uniq()}`), false)
  const sbx = srv.track(await Sandbox.create(name))
  const r = await sbx.commands.run('bash --version | head -1')
  assert.match(r.stdout, /bash/)
  const si = await sbx.getInfo()
  assert.equal(si.cpuCount, 1)
  assert.equal(si.memoryMB, 256)
  assert.equal(si.templateId, info.templateId)
  await sbx.kill()
  // An OCI-looking templateID that is no catalog template starts from the local image.
  const direct = srv.track(await Sandbox.create(BASE_IMAGE))
  assert.match((await direct.commands.run('echo direct')).stdout, /direct/)
  await direct.kill()
})

test('Template.build with copy, runCmd, setEnvs, setUser, setWorkdir', { timeout: 600000 }, async () => {
  const ctxDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tplctx-'))
  fs.mkdirSync(path.join(ctxDir, 'app'))
  fs.writeFileSync(path.join(ctxDir, 'app', 'hello.txt'), 'hello from the context\n')
  fs.writeFileSync(path.join(ctxDir, 'req.txt'), 'requests\n')
  const name = `recipe-${uniq()}`
  const t = Template({ fileContextPath: ctxDir })
    .fromImage(BASE_IMAGE)
    .copy('app', '/opt/app')
    .copy('req.txt', '/opt/req.txt')
    .setEnvs({ GREETING: "it's built" })
    .runCmd('echo "$GREETING" > /opt/greeting && cat /opt/app/hello.txt > /opt/copied')
    .runCmd('mkdir -p /srv/work && chown 1000:1000 /srv/work')
    .setUser('user')
    .runCmd('id -u > /srv/work/built-as')
    .setWorkdir('/srv/work')
  const logs = []
  try {
    await Template.build(t, name, { onBuildLogs: (l) => logs.push(l.message || String(l)) })
  } finally {
    fs.rmSync(ctxDir, { recursive: true, force: true })
  }
  const sbx = srv.track(await Sandbox.create(name))
  const r = await sbx.commands.run('cat /opt/greeting /opt/copied /opt/req.txt /srv/work/built-as; echo "runtime GREETING=${GREETING:-unset}"; pwd; id -un')
  assert.equal(
    r.stdout,
    "it's built\nhello from the context\nrequests\n1000\nruntime GREETING=unset\n/srv/work\nuser\n",
  )
  await sbx.kill()
})

test('a failing RUN reports error with its step; a failed rebuild keeps the old image', { timeout: 600000 }, async () => {
  const name = `rebuild-${uniq()}`
  await Template.build(Template().fromImage(BASE_IMAGE).runCmd('echo v1 > /etc/version'), name)
  await assert.rejects(
    Template.build(Template().fromImage(BASE_IMAGE).runCmd('echo v2 > /etc/version').runCmd('echo failing; exit 3'), name),
    (e) => e instanceof BuildError && /exit code: 3|exit status 3|did not complete successfully/.test(e.message),
  )
  const sbx = srv.track(await Sandbox.create(name))
  assert.equal((await sbx.commands.run('cat /etc/version')).stdout, 'v1\n')
  await sbx.kill()
})
