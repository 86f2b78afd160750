// The handler bench/functions.py uses for a call to a backend: it fetches a product list (about 1.5 KiB of JSON)
// from the backend, keeps the products in stock and answers them reshaped. The same file runs on Portico,
// `deno serve`, Bun and workerd: the backend's base URL comes from `env.API` (Portico: `http://api`, the cluster
// named `api`; workerd: a text binding), else from the process environment (`deno serve` and Bun pass no `env`).
let api;
export default {
  async fetch(request, env) {
    api ??= (typeof env?.API === "string" ? env.API : undefined) ??
      (globalThis.Deno ? Deno.env.get("API") : globalThis.process?.env.API);
    const upstream = await fetch(`${api}/products.json`);
    if (!upstream.ok) return new Response(`backend answered ${upstream.status}`, { status: 502 });
    const { products } = await upstream.json();
    const inStock = products.filter((p) => p.stock > 0)
      .map((p) => ({ id: p.id, name: p.name.toUpperCase(), price: Math.round(p.price * 120) / 100 }));
    return Response.json({ count: inStock.length, products: inStock });
  },
};
