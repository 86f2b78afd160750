// A fetch handler, as Cloudflare Workers, Deno (`deno serve`) and Bun run it: see docs/functions.md.
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (request.method === "POST") {
      const text = await request.text();
      return Response.json({ received: text.length, echo: text.slice(0, 100) });
    }
    const name = url.searchParams.get("name") || "world";
    return new Response(`${env.GREETING}, ${name}!\n`, { headers: { "x-served-by": "portico-function" } });
  },
};
