#!/usr/bin/python3
"""A stand-in for the EC2 instance metadata service (IMDSv2), for tests.

PUT /latest/api/token gives a token; GETs need it (X-aws-ec2-metadata-token) and answer
/latest/meta-data/local-ipv4 (--local-ipv4), /latest/meta-data/instance-id, and 404 for
/latest/meta-data/spot/instance-action (no interruption).
Usage: imds.py --address A --port P --local-ipv4 IP
"""
import argparse
import http.server

TOKEN = "standin-imds-token"


def handler(local_ipv4):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, code, body=""):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self):
            if self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"):
                self.answer(200, TOKEN)
            else:
                self.answer(400)

        def do_GET(self):
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                self.answer(401)
            elif self.path == "/latest/meta-data/local-ipv4":
                self.answer(200, local_ipv4)
            elif self.path == "/latest/meta-data/instance-id":
                self.answer(200, "i-0standin")
            else:
                self.answer(404)

    return Handler


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--local-ipv4", required=True)
    args = parser.parse_args()
    http.server.ThreadingHTTPServer((args.address, args.port),
                                    handler(args.local_ipv4)).serve_forever()
