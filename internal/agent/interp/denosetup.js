// Run silently in each new Deno kernel (interp.denoSetup). Deno shows a
// string result as inspect() does, quoted ("abc"); e2b's JavaScript kernel
// shows its text (abc), and its clients compare that text. Deno formats a
// result that is not an object with inspectArgs(["%o", value]) looked up on
// Deno[Deno.internal] at each call; only that exact call with a string is
// answered with the string itself. Without the internal hook nothing changes.
{
  const internal = Deno[Deno.internal];
  const inspectArgs = internal && internal.inspectArgs;
  if (typeof inspectArgs === "function") {
    internal.inspectArgs = function (args, options) {
      if (Array.isArray(args) && args.length === 2 && args[0] === "%o" && typeof args[1] === "string") {
        return args[1];
      }
      return inspectArgs.call(this, args, options);
    };
  }
}
