"""A stand-in for AWS's Price List Query API (moto has none): a real HTTP server on loopback
speaking the API's JSON 1.1 protocol (`X-Amz-Target: AWSPriceListService.GetProducts`),
answering with PriceList items in AWS's own document shape from a table the test controls.
boto3 reaches it through AWS_ENDPOINT_URL_PRICING, the same way it reaches the real API.
"""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from .loopback import serve


def price_item(attributes: dict, unit: str, usd: str, sku: str) -> str:
    """One PriceList entry as AWS writes it: a JSON document (as a string) per SKU."""
    term = f"{sku}.JRTCKXETXF"
    return json.dumps({
        "product": {"productFamily": attributes.get("productFamily", "Compute Instance"),
                    "attributes": attributes, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {term: {
            "priceDimensions": {f"{term}.6YS6EN2CT7": {
                "unit": unit, "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "description": f"${usd} per {unit}", "rateCode": f"{term}.6YS6EN2CT7",
                "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"})


class PriceList:
    """Products the fake API knows; `requests` records every GetProducts filter set."""

    def __init__(self):
        self.items: list[tuple[dict, str]] = []  # (attributes, PriceList JSON)
        self.requests: list[dict] = []

    def instance(self, region: str, instance_type: str, usd: str) -> None:
        attrs = {"productFamily": "Compute Instance", "instanceType": instance_type,
                 "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
                 "preInstalledSw": "NA", "capacitystatus": "Used"}
        self.items.append((attrs, price_item(attrs, "Hrs", usd, f"SKU{len(self.items)}")))
        # A zero-priced row for the same filters (as the real list has for some capacity
        # reservations' SKUs): it must not win.
        self.items.append((attrs, price_item(attrs, "Hrs", "0.0000000000",
                                             f"SKU{len(self.items)}")))

    def gp3(self, region: str, usd: str) -> None:
        attrs = {"productFamily": "Storage", "volumeApiName": "gp3", "regionCode": region}
        self.items.append((attrs, price_item(attrs, "GB-Mo", usd, f"SKU{len(self.items)}")))

    def answer(self, body: dict) -> dict:
        filters = {f["Field"]: f["Value"] for f in body.get("Filters") or []}
        self.requests.append(filters)
        found = [doc for attrs, doc in self.items
                 if all(attrs.get(k) == v for k, v in filters.items())]
        return {"FormatVersion": "aws_v1", "PriceList": found}


@pytest.fixture
def price_list(monkeypatch):
    prices = PriceList()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.headers.get("X-Amz-Target") != "AWSPriceListService.GetProducts":
                self.send_response(400)
                self.end_headers()
                return
            data = json.dumps(prices.answer(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-amz-json-1.1")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    url, server = serve(Handler)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)
    yield prices
    server.close()
