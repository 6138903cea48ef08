'use strict'
// Warm-pool helpers shared by the benchmarks (PUT/GET /templates/{id}/pool).

// setPool sets template's warm pool to n standbys.
async function setPool(srv, template, n) {
  const r = await srv.api('PUT', `/templates/${template}/pool`, { body: { size: n } })
  if (r.status !== 200) throw new Error(`PUT /templates/${template}/pool: ${r.status} ${r.text}`)
}

// waitPool waits until the pool is full: at least max(want, target) standbys
// ready (a pool grows past its size while recent demand asks for it: serve
// --pool-memory-mb), or none at all for want 0.
async function waitPool(srv, template, want, deadline) {
  let last
  while (Date.now() < deadline) {
    const r = await srv.api('GET', `/templates/${template}/pool`)
    last = r.json
    if (r.status === 200) {
      const { ready, target = want } = r.json
      if (want === 0 ? ready === 0 : ready >= Math.max(want, target)) return
    }
    await new Promise((res) => setTimeout(res, 50))
  }
  throw new Error(`warm pool of ${template} did not reach ${want} standbys in time (last ${JSON.stringify(last)})`)
}

module.exports = { setPool, waitPool }
