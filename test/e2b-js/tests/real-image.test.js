'use strict'
// The first five minutes of a new user on Sandbox.create() (the plain e2b SDK, the
// default base template): it is Debian 12, pip and npm install from their registries
// over https, sudo works without a password, root can apt-get install, and git (the
// SDK's git module included) works on a local repository.
const test = require('node:test')
const assert = require('node:assert/strict')
const { Sandbox, CommandExitError } = require('e2b')
const { setup } = require('./harness')

const srv = setup(test)
let sbx

test.before(async () => {
  await srv.ensure()
  sbx = srv.track(await Sandbox.create({ timeoutMs: 900000 }))
})

// run runs cmd and, when it fails, shows its output in the assertion.
async function run(cmd, opts = {}) {
  try {
    return await sbx.commands.run(cmd, { timeoutMs: 300000, requestTimeoutMs: 300000, ...opts })
  } catch (e) {
    if (e instanceof CommandExitError) {
      assert.fail(`${cmd}: exit ${e.exitCode}\nstdout: ${e.stdout.slice(-2000)}\nstderr: ${e.stderr.slice(-2000)}`)
    }
    throw e
  }
}

test('the default template is Debian 12 and commands run as user', { timeout: 60000 }, async () => {
  const osr = await sbx.files.read('/etc/os-release')
  assert.match(osr, /^ID=debian$/m)
  assert.match(osr, /^VERSION_ID="12"$/m)
  assert.equal((await run('whoami')).stdout, 'user\n')
  assert.equal((await run('pwd')).stdout, '/home/user\n')
  for (const tool of ['python3', 'pip', 'node', 'npm', 'git', 'curl', 'wget', 'jq', 'make', 'gcc', 'unzip', 'ps', 'ip']) {
    await run(`command -v ${tool}`)
  }
})

test('pip install requests as user, then import it', { timeout: 300000 }, async () => {
  await assert.rejects(sbx.commands.run('python3 -c "import requests"'), CommandExitError, 'requests is not preinstalled')
  await run('pip install --no-input requests')
  const r = await run('python3 -c "import requests; print(requests.__version__)"')
  assert.match(r.stdout, /^\d+\.\d+/)
})

test('sudo works without a password for user', { timeout: 60000 }, async () => {
  await run('sudo -n true')
  assert.equal((await run('sudo -n id -u')).stdout, '0\n')
})

test('root can apt-get update and install a package', { timeout: 300000 }, async () => {
  await assert.rejects(sbx.commands.run('test -e /usr/games/sl'), CommandExitError, 'sl is not preinstalled')
  await run('apt-get update', { user: 'root' })
  await run('DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends sl', { user: 'root' })
  const st = await run("dpkg-query -W -f '${Status}' sl")
  assert.equal(st.stdout, 'install ok installed')
  await run('test -x /usr/games/sl')
})

test('git init and commit a repository, then sbx.git.clone it', { timeout: 120000 }, async () => {
  await sbx.git.init('/home/user/origin', { initialBranch: 'main' })
  await sbx.files.write('/home/user/origin/README.md', '# hello from the sandbox\n')
  await sbx.git.add('/home/user/origin')
  await sbx.git.commit('/home/user/origin', 'first commit', { authorName: 'Cubicle Test', authorEmail: 'test@example.com' })
  const log = await run('git -C /home/user/origin log --format=%s%x09%an')
  assert.equal(log.stdout, 'first commit\tCubicle Test\n')

  await sbx.git.clone('file:///home/user/origin', { path: '/home/user/clone' })
  assert.equal(await sbx.files.read('/home/user/clone/README.md'), '# hello from the sandbox\n')
  const st = await sbx.git.status('/home/user/clone')
  assert.equal(st.currentBranch, 'main')
  assert.equal(st.isClean, true)
  const br = await sbx.git.branches('/home/user/clone')
  assert.equal(br.currentBranch, 'main')
})

test('npm init and npm install from the registry', { timeout: 300000 }, async () => {
  await run('mkdir -p /home/user/proj && cd /home/user/proj && npm init -y >/dev/null && npm i --no-audit --no-fund is-number')
  const r = await run(`cd /home/user/proj && node -e "console.log(require('is-number')(5), require('is-number')('x'))"`)
  assert.equal(r.stdout, 'true false\n')
  const pkg = JSON.parse(await sbx.files.read('/home/user/proj/package.json'))
  assert.ok(pkg.dependencies && pkg.dependencies['is-number'], `package.json dependencies: ${JSON.stringify(pkg.dependencies)}`)
})

test('curl reaches https://pypi.org through the trusted CAs', { timeout: 120000 }, async () => {
  const r = await run("curl -sS --max-time 60 https://pypi.org/simple/ -o /dev/null -w '%{http_code}'")
  assert.equal(r.stdout, '200')
})
