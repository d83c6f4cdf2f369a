//! TPC-H queries (filled in by the DataFusion issue).
