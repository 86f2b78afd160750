// The handler bench/functions.py sends a 4 KiB JSON body to (POST): it parses the body, sums the order's lines and
// answers a small JSON summary. The same file runs on Portico, `deno serve`, Bun and workerd.
export default {
  async fetch(request) {
    const order = await request.json();
    let total = 0, units = 0;
    for (const line of order.lines) {
      total += line.price * line.quantity;
      units += line.quantity;
    }
    return Response.json({ id: order.id, customer: order.customer.name, lines: order.lines.length, units,
                           total: Math.round(total * 100) / 100 });
  },
};
