"""Go `encoding/json` behaviour the CNI plugin and the installer must reproduce byte for byte,
one module per file of Go's package:

    scanner.py  Go's validity scanner: the same first error with the same text
                (`invalid character 'o' in literal null (expecting 'u')`), before anything
                is decoded
    decode.py   a document into Python values (duplicates and number literals kept), then
                into a typed schema the way Go fills a struct: exact key match first, then
                case-insensitive; duplicate keys decoded in order (objects merge, slices
                replace); `null` leaves scalars alone; the first type mismatch reported as Go
                words it, after the whole document was walked
    encode.py   `json.Marshal`/`MarshalIndent` (HTML-safe escapes, Go's float notation, no
                trailing newline), for CNI results and errors and the installer's conflists
"""
