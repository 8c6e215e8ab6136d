//! What the text scanners (JSON, CSV, raw) hand the column builders: the
//! layout of a text record and each field's raw value in it.

/// How a text record is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextFormat {
    /// One flat JSON object per record.
    Json,
    /// One line of delimited text per record, fields in declared order.
    Csv { delimiter: u8 },
    /// The whole record in the first declared column (Utf8 or Binary).
    Raw,
}

/// One value as found in a record, before it is checked against its type.
/// Positions are byte offsets into the record, so that the scratch space
/// holding them can outlive any one record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Raw {
    Null,
    /// String contents without quotes; `escaped` if they hold a backslash.
    Str {
        start: u32,
        end: u32,
        escaped: bool,
    },
    Num {
        start: u32,
        end: u32,
    },
    Bool(bool),
    /// An object or array (its bytes, brackets included): no declared
    /// type takes one; a Debezium envelope holds its rows in them.
    Nested {
        start: u32,
        end: u32,
    },
}

/// What the scanner found about a record as a whole.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scanned {
    /// The whole record is known to be UTF-8 (all ASCII, or checked), so
    /// every slice of it between quotes is too.
    pub(crate) utf8: bool,
}
