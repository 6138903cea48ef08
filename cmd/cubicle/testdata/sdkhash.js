'use strict'
// Prints the filesHash the e2b JS SDK computes for COPY steps, for
// template_test.go. Usage: node sdkhash.js <e2b module dir> <context dir> '<[[src,dest],...]>'
const [, , mod, ctx, copies] = process.argv
const { Template } = require(mod)

async function main() {
  let t = Template({ fileContextPath: ctx }).fromImage('cubicle/base:1')
  for (const [src, dest] of JSON.parse(copies)) t = t.copy(src, dest)
  const spec = JSON.parse(await Template.toJSON(t, true))
  process.stdout.write(JSON.stringify(spec.steps.filter((s) => s.type === 'COPY').map((s) => s.filesHash)))
}
main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e))
  process.exit(1)
})
