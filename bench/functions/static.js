// The floor: a handler that answers a fixed text, on Deno, Bun and workerd. Portico serves the same answer from a
// `static:` route (no JavaScript), so this scenario measures each server's HTTP path alone.
export default {
  fetch() {
    return new Response("hello\n", { headers: { "content-type": "text/plain" } });
  },
};
