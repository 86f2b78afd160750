"""Keys, tokens and a JWKS server for the jwt tests, made with PyJWT and cryptography (PyPI).

    jwt_tool.py keys DIR          makes a key per algorithm family in DIR: private and public PEMs, and
                                  DIR/<name>.jwk (the public key as a JWK, written by PyJWT)
    jwt_tool.py sign DIR          reads JSON lines {"alg", "key", "kid"?, "claims"} on stdin and prints one
                                  token per line, signed by PyJWT
    jwt_tool.py serve DIR PORT    serves DIR/jwks.json at /jwks.json (read again on every request) and the
                                  number of requests served at /count; 503 while DIR/down exists
"""

import http.server
import json
import pathlib
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa


def pem_private(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_public(key):
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def keys(out):
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "rsa": (rsa.generate_private_key(public_exponent=65537, key_size=2048), jwt.algorithms.RSAAlgorithm),
        "p256": (ec.generate_private_key(ec.SECP256R1()), jwt.algorithms.ECAlgorithm),
        "p384": (ec.generate_private_key(ec.SECP384R1()), jwt.algorithms.ECAlgorithm),
        "ed25519": (ed25519.Ed25519PrivateKey.generate(), jwt.algorithms.OKPAlgorithm),
        # Keys served by the JWKS server, rotated during the test.
        "jwks-a": (ec.generate_private_key(ec.SECP256R1()), jwt.algorithms.ECAlgorithm),
        "jwks-b": (rsa.generate_private_key(public_exponent=65537, key_size=2048), jwt.algorithms.RSAAlgorithm),
    }
    for name, (key, algorithm) in made.items():
        (out / f"{name}.key").write_bytes(pem_private(key))
        (out / f"{name}.pub").write_bytes(pem_public(key))
        (out / f"{name}.jwk").write_text(algorithm.to_jwk(key.public_key()))


def sign(out):
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        key = req["key"]
        material = key.encode() if req["alg"].startswith("HS") else (out / f"{key}.key").read_bytes()
        headers = {"kid": req["kid"]} if req.get("kid") else None
        print(jwt.encode(req["claims"], material, algorithm=req["alg"], headers=headers), flush=True)


def serve(out, port):
    served = {"count": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/count":
                body, status = str(served["count"]).encode(), 200
            elif (out / "down").exists():
                served["count"] += 1
                body, status = b"down for maintenance", 503
            else:
                served["count"] += 1
                body, status = (out / "jwks.json").read_bytes(), 200
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    verb, directory = sys.argv[1], pathlib.Path(sys.argv[2])
    if verb == "keys":
        keys(directory)
    elif verb == "sign":
        sign(directory)
    elif verb == "serve":
        serve(directory, int(sys.argv[3]))
    else:
        sys.exit(f"unknown verb {verb}")
