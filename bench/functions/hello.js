// The hello handler bench/functions.py serves with Portico, `deno serve`, Bun and workerd.
export default {
  fetch(request, env) {
    const url = new URL(request.url);
    const name = url.searchParams.get("name") || "world";
    return Response.json({ message: `${env?.GREETING ?? "Hello"}, ${name}!`, path: url.pathname });
  },
};
