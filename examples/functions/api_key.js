// A JavaScript filter: requests without the right key are answered here; the others go on to the cluster,
// changed, and their responses are tagged on the way back. See docs/functions.md, "Functions as filters".
export default {
  onRequest(request, env) {
    if (request.headers.get("x-api-key") !== env.API_KEY) {
      return Response.json({ error: "send the header x-api-key" }, { status: 401 });
    }
    request.headers.delete("x-api-key");
    request.headers.set("x-api-client", "example");
  },
  onResponse(response) {
    response.headers.set("x-checked-by", "api_key.js");
  },
};
