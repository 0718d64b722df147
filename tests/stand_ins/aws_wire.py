"""The AWS wire protocols for the stand-in endpoint (tests/stand_ins/aws_endpoint.py), as
botocore speaks them, read from and written by botocore's own service models (input and
output shapes):
  - ec2 and query (form-encoded POST, Action=...): the request's parameters decoded, the
    answer as the protocol's XML;
  - JSON 1.1 (X-Amz-Target): the operation from the header, JSON both ways;
  - S3 REST, path-style: ListObjectsV2 from the method, path and query, XML answers;
and AwsError, the error answer, with its body in each protocol.
"""
import base64
import json
import urllib.parse
import xml.etree.ElementTree as ElementTree


class AwsError(Exception):
    """An error answer: the service's code and message, HTTP 400 unless given."""

    def __init__(self, code, message, status=400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def ec2_name(shape, default):
    if "queryName" in shape.serialization:
        return shape.serialization["queryName"]
    name = shape.serialization.get("name")
    return name[0].upper() + name[1:] if name else default


def parse_query(flat, shape, ec2, prefix=""):
    """The API parameters of a form-encoded query/ec2 request (`flat`: wire name ->
    value), read by `shape` the way botocore's QuerySerializer/EC2Serializer wrote them."""
    def present(at):
        return at in flat or any(key.startswith(at + ".") for key in flat)

    kind = shape.type_name
    if kind == "structure":
        out = {}
        for name, member in shape.members.items():
            wire = ec2_name(member, name) if ec2 else member.serialization.get("name", name)
            at = f"{prefix}.{wire}" if prefix else wire
            if present(at):
                out[name] = parse_query(flat, member, ec2, at)
        return out
    if kind == "list":
        if flat.get(prefix) == "":
            return []
        if ec2:
            items_at = prefix
        elif shape.serialization.get("flattened"):
            items_at = prefix
            if shape.member.serialization.get("name"):
                items_at = ".".join(prefix.split(".")[:-1] + [shape.member.serialization["name"]])
        else:
            items_at = f"{prefix}.{shape.member.serialization.get('name', 'member')}"
        items, i = [], 1
        while present(f"{items_at}.{i}"):
            items.append(parse_query(flat, shape.member, ec2, f"{items_at}.{i}"))
            i += 1
        return items
    if kind == "map":
        entries = prefix if shape.serialization.get("flattened") else f"{prefix}.entry"
        key_name = shape.key.serialization.get("name", "key")
        value_name = shape.value.serialization.get("name", "value")
        out, i = {}, 1
        while f"{entries}.{i}.{key_name}" in flat:
            out[flat[f"{entries}.{i}.{key_name}"]] = parse_query(flat, shape.value, ec2, f"{entries}.{i}.{value_name}")
            i += 1
        return out
    value = flat.get(prefix, "")
    if kind == "boolean":
        return value == "true"
    if kind in ("integer", "long"):
        return int(value)
    if kind in ("float", "double"):
        return float(value)
    return value  # string, blob (base64), timestamp (ISO 8601) as sent


def scalar_text(value, shape):
    if shape.type_name == "boolean":
        return "true" if value else "false"
    if shape.type_name == "timestamp":
        return value if isinstance(value, str) else value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    if shape.type_name == "blob":
        return base64.b64encode(value).decode() if isinstance(value, bytes) else value
    return str(value)


def to_xml(parent, name, value, shape, ec2):
    """`value` (an API answer shaped by `shape`) as XML element `name` under `parent`:
    lists as <item> (ec2) or <member> (query, unless the model names the member or
    flattens the list), members under their serialization names."""
    element = ElementTree.SubElement(parent, name)
    fill_xml(element, value, shape, ec2)


def fill_xml(element, value, shape, ec2):
    kind = shape.type_name
    if kind == "structure":
        for member_name, member in shape.members.items():
            if member_name not in value or "location" in member.serialization:
                continue
            item = value[member_name]
            if member.type_name == "list" and member.serialization.get("flattened"):
                tag = member.member.serialization.get("name") or member.serialization.get("name", member_name)
                for entry in item:
                    to_xml(element, tag, entry, member.member, ec2)
            else:
                to_xml(element, member.serialization.get("name", member_name), item, member, ec2)
    elif kind == "list":
        tag = "item" if ec2 else shape.member.serialization.get("name", "member")
        for entry in value:
            to_xml(element, tag, entry, shape.member, ec2)
    elif kind == "map":
        for key, item in value.items():
            entry = ElementTree.SubElement(element, "entry")
            to_xml(entry, shape.key.serialization.get("name", "key"), key, shape.key, ec2)
            to_xml(entry, shape.value.serialization.get("name", "value"), item, shape.value, ec2)
    else:
        element.text = scalar_text(value, shape)


def xml_answer(service_model, operation_model, answer):
    """The body of a query/ec2/rest-xml answer."""
    namespace = service_model.metadata.get("xmlNamespace") or "https://standin.example/"
    if isinstance(namespace, dict):  # rest-xml: {"uri": ...}
        namespace = namespace.get("uri", "https://standin.example/")
    protocol = service_model.protocol
    shape = operation_model.output_shape
    if protocol == "rest-xml":
        root = ElementTree.Element(shape.serialization.get("name", shape.name) if shape else "Response",
                                   xmlns=namespace)
        if shape is not None:
            fill_xml(root, answer, shape, False)
    else:
        root = ElementTree.Element(f"{operation_model.name}Response", xmlns=namespace)
        holder = root
        if shape is not None and protocol == "query":
            holder = ElementTree.SubElement(root, shape.serialization.get("resultWrapper", f"{operation_model.name}Result"))
        if shape is not None:
            fill_xml(holder, answer, shape, protocol == "ec2")
        if protocol == "ec2":
            ElementTree.SubElement(root, "requestId").text = "standin-request"
        else:
            metadata = ElementTree.SubElement(root, "ResponseMetadata")
            ElementTree.SubElement(metadata, "RequestId").text = "standin-request"
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


def error_body(protocol, error):
    """(content type, body) of an error answer in `protocol`."""
    if protocol == "json":
        return "application/x-amz-json-1.1", json.dumps({"__type": error.code, "message": error.message}).encode()
    if protocol == "ec2":
        root = ElementTree.Element("Response")
        detail = ElementTree.SubElement(ElementTree.SubElement(root, "Errors"), "Error")
        ElementTree.SubElement(root, "RequestID").text = "standin-request"
    elif protocol == "rest-xml":
        root = detail = ElementTree.Element("Error")
    else:
        root = ElementTree.Element("ErrorResponse")
        detail = ElementTree.SubElement(root, "Error")
        ElementTree.SubElement(detail, "Type").text = "Sender"
        ElementTree.SubElement(root, "RequestId").text = "standin-request"
    ElementTree.SubElement(detail, "Code").text = error.code
    ElementTree.SubElement(detail, "Message").text = error.message
    return "text/xml", ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


def read_request(model, body, headers, method, path):
    """(operation name, API parameters) of the request (`method` `path`, with `headers`
    and `body`) to the service of `model`, in the service's protocol."""
    if model.protocol in ("query", "ec2"):
        flat = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        name = flat.pop("Action", "")
        flat.pop("Version", None)
        if name not in model.operation_names:
            raise AwsError("InvalidAction", f"The action {name} is not valid for this web service.")
        shape = model.operation_model(name).input_shape
        return name, parse_query(flat, shape, model.protocol == "ec2") if shape else {}
    if model.protocol == "json":
        name = headers.get("X-Amz-Target", "").rpartition(".")[2]
        if name not in model.operation_names:
            raise AwsError("UnknownOperationException", f"Unknown operation {name}")
        return name, json.loads(body or b"{}")
    # S3 REST, path-style: the bucket, then the key.
    url = urllib.parse.urlsplit(path)
    query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
    bucket, _, key = url.path.lstrip("/").partition("/")
    if method == "GET" and bucket and not key and query.get("list-type") == "2":
        params = {"Bucket": bucket}
        for wire, name in (("prefix", "Prefix"), ("delimiter", "Delimiter"), ("continuation-token", "ContinuationToken")):
            if wire in query:
                params[name] = query[wire]
        return "ListObjectsV2", params
    return f"{method} {url.path}", dict(query)


def answer_body(model, operation, result):
    """(content type, body) of `result`, the answer to `operation` of the service of
    `model`, in the service's protocol."""
    operation_model = model.operation_model(operation)
    if model.protocol == "json":
        return "application/x-amz-json-1.1", json.dumps(result, default=str).encode()
    return "text/xml", xml_answer(model, operation_model, result)
