//! Status codes the kernels report (see `common.cuh`), as text for errors.

/// Describes a kernel status code.
pub fn describe(code: u32) -> &'static str {
    match code {
        0 => "ok",
        1 => "page header runs past the end of the column chunk",
        2 => "malformed page header",
        3 => "page body runs past the end of the column chunk",
        4 => "negative size or count in a page header",
        5 => "unknown page type",
        6 => "page count changed between passes",
        7 => "a value runs past the end of its page",
        8 => "malformed RLE/bit-packed run",
        9 => "bit width over 32",
        10 => "dictionary index out of range",
        11 => "page holds fewer values than its header claims",
        12 => "page writes past the end of its column",
        13 => "unsupported encoding",
        14 => "dictionary-encoded page without a dictionary page",
        15 => "decimal byte array longer than the output type",
        16 => "definition level out of range",
        _ => "unknown error",
    }
}
