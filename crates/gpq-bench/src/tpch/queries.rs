//! The 22 TPC-H queries as SQL, as DataFusion's benchmarks run them
//! (`benchmarks/queries/q1.sql` .. `q22.sql` of apache/datafusion, with their
//! substitution parameters). Derived from TPC-H under the terms of the TPC
//! Fair Use Policy; TPC-H queries are Copyright 1993-2022 Transaction
//! Processing Performance Council.
//!
//! Query 15 is three statements: it creates the view `revenue0`, queries it
//! and drops it. [`statements`] splits a query into its statements and
//! [`run_query`] (with the `datafusion` feature) runs them all and returns
//! the rows of the one that is a query. [`register_tables`] registers the
//! eight tables of a directory, as gpq tables or as DataFusion's built-in
//! Parquet tables.

use gpq::{Error, Result};

/// Number of TPC-H queries.
pub const QUERY_COUNT: usize = 22;

const QUERIES: [&str; QUERY_COUNT] = [
    // 1
    r"select
    l_returnflag,
    l_linestatus,
    sum(l_quantity) as sum_qty,
    sum(l_extendedprice) as sum_base_price,
    sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
    sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge,
    avg(l_quantity) as avg_qty,
    avg(l_extendedprice) as avg_price,
    avg(l_discount) as avg_disc,
    count(*) as count_order
from
    lineitem
where
    l_shipdate <= date '1998-12-01' - interval '68 days'
group by
    l_returnflag,
    l_linestatus
order by
    l_returnflag,
    l_linestatus;
",
    // 2
    r"select
    s_acctbal,
    s_name,
    n_name,
    p_partkey,
    p_mfgr,
    s_address,
    s_phone,
    s_comment
from
    part,
    supplier,
    partsupp,
    nation,
    region
where
    p_partkey = ps_partkey
    and s_suppkey = ps_suppkey
    and p_size = 48
    and p_type like '%TIN'
    and s_nationkey = n_nationkey
    and n_regionkey = r_regionkey
    and r_name = 'ASIA'
    and ps_supplycost = (
        select
            min(ps_supplycost)
        from
            partsupp,
            supplier,
            nation,
            region
        where
            p_partkey = ps_partkey
            and s_suppkey = ps_suppkey
            and s_nationkey = n_nationkey
            and n_regionkey = r_regionkey
            and r_name = 'ASIA'
    )
order by
    s_acctbal desc,
    n_name,
    s_name,
    p_partkey limit 100;
",
    // 3
    r"select
    l_orderkey,
    sum(l_extendedprice * (1 - l_discount)) as revenue,
    o_orderdate,
    o_shippriority
from
    customer,
    orders,
    lineitem
where
    c_mktsegment = 'BUILDING'
    and c_custkey = o_custkey
    and l_orderkey = o_orderkey
    and o_orderdate < date '1995-03-15'
    and l_shipdate > date '1995-03-15'
group by
    l_orderkey,
    o_orderdate,
    o_shippriority
order by
    revenue desc,
    o_orderdate limit 10;
",
    // 4
    r"select
    o_orderpriority,
    count(*) as order_count
from
    orders
where
    o_orderdate >= date '1995-04-01'
    and o_orderdate < date '1995-04-01' + interval '3' month
    and exists (
        select
            *
        from
            lineitem
        where
            l_orderkey = o_orderkey
            and l_commitdate < l_receiptdate
    )
group by
    o_orderpriority
order by
    o_orderpriority;
",
    // 5
    r"select
    n_name,
    sum(l_extendedprice * (1 - l_discount)) as revenue
from
    customer,
    orders,
    lineitem,
    supplier,
    nation,
    region
where
    c_custkey = o_custkey
    and l_orderkey = o_orderkey
    and l_suppkey = s_suppkey
    and c_nationkey = s_nationkey
    and s_nationkey = n_nationkey
    and n_regionkey = r_regionkey
    and r_name = 'AFRICA'
    and o_orderdate >= date '1994-01-01'
    and o_orderdate < date '1994-01-01' + interval '1' year
group by
    n_name
order by
    revenue desc;
",
    // 6
    r"select
    sum(l_extendedprice * l_discount) as revenue
from
    lineitem
where
    l_shipdate >= date '1994-01-01'
    and l_shipdate < date '1994-01-01' + interval '1' year
    and l_discount between 0.04 - 0.01 and 0.04 + 0.01
    and l_quantity < 24;
",
    // 7
    r"select
    supp_nation,
    cust_nation,
    l_year,
    sum(volume) as revenue
from
    (
        select
            n1.n_name as supp_nation,
            n2.n_name as cust_nation,
            extract(year from l_shipdate) as l_year,
            l_extendedprice * (1 - l_discount) as volume
        from
            supplier,
            lineitem,
            orders,
            customer,
            nation n1,
            nation n2
        where
            s_suppkey = l_suppkey
            and o_orderkey = l_orderkey
            and c_custkey = o_custkey
            and s_nationkey = n1.n_nationkey
            and c_nationkey = n2.n_nationkey
            and (
                (n1.n_name = 'GERMANY' and n2.n_name = 'IRAQ')
                or (n1.n_name = 'IRAQ' and n2.n_name = 'GERMANY')
            )
            and l_shipdate between date '1995-01-01' and date '1996-12-31'
    ) as shipping
group by
    supp_nation,
    cust_nation,
    l_year
order by
    supp_nation,
    cust_nation,
    l_year;
",
    // 8
    r"select
    o_year,
    sum(case
        when nation = 'IRAQ' then volume
        else 0
    end) / sum(volume) as mkt_share
from
    (
        select
            extract(year from o_orderdate) as o_year,
            l_extendedprice * (1 - l_discount) as volume,
            n2.n_name as nation
        from
            part,
            supplier,
            lineitem,
            orders,
            customer,
            nation n1,
            nation n2,
            region
        where
            p_partkey = l_partkey
            and s_suppkey = l_suppkey
            and l_orderkey = o_orderkey
            and o_custkey = c_custkey
            and c_nationkey = n1.n_nationkey
            and n1.n_regionkey = r_regionkey
            and r_name = 'MIDDLE EAST'
            and s_nationkey = n2.n_nationkey
            and o_orderdate between date '1995-01-01' and date '1996-12-31'
            and p_type = 'LARGE PLATED STEEL'
    ) as all_nations
group by
    o_year
order by
    o_year;
",
    // 9
    r"select
    nation,
    o_year,
    sum(amount) as sum_profit
from
    (
        select
            n_name as nation,
            extract(year from o_orderdate) as o_year,
            l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity as amount
        from
            part,
            supplier,
            lineitem,
            partsupp,
            orders,
            nation
        where
            s_suppkey = l_suppkey
            and ps_suppkey = l_suppkey
            and ps_partkey = l_partkey
            and p_partkey = l_partkey
            and o_orderkey = l_orderkey
            and s_nationkey = n_nationkey
            and p_name like '%moccasin%'
    ) as profit
group by
    nation,
    o_year
order by
    nation,
    o_year desc;
",
    // 10
    r"select
    c_custkey,
    c_name,
    sum(l_extendedprice * (1 - l_discount)) as revenue,
    c_acctbal,
    n_name,
    c_address,
    c_phone,
    c_comment
from
    customer,
    orders,
    lineitem,
    nation
where
    c_custkey = o_custkey
    and l_orderkey = o_orderkey
    and o_orderdate >= date '1993-07-01'
    and o_orderdate < date '1993-07-01' + interval '3' month
    and l_returnflag = 'R'
    and c_nationkey = n_nationkey
group by
    c_custkey,
    c_name,
    c_acctbal,
    c_phone,
    n_name,
    c_address,
    c_comment
order by
    revenue desc limit 20;
",
    // 11
    r"select
    ps_partkey,
    sum(ps_supplycost * ps_availqty) as value
from
    partsupp,
    supplier,
    nation
where
    ps_suppkey = s_suppkey
    and s_nationkey = n_nationkey
    and n_name = 'ALGERIA'
group by
    ps_partkey having
        sum(ps_supplycost * ps_availqty) > (
            select
                sum(ps_supplycost * ps_availqty) * 0.0001000000
            from
                partsupp,
                supplier,
                nation
            where
                ps_suppkey = s_suppkey
                and s_nationkey = n_nationkey
                and n_name = 'ALGERIA'
        )
order by
    value desc;
",
    // 12
    r"select
    l_shipmode,
    sum(case
        when o_orderpriority = '1-URGENT'
            or o_orderpriority = '2-HIGH'
            then 1
        else 0
    end) as high_line_count,
    sum(case
        when o_orderpriority <> '1-URGENT'
            and o_orderpriority <> '2-HIGH'
            then 1
        else 0
    end) as low_line_count
from
    orders,
    lineitem
where
    o_orderkey = l_orderkey
    and l_shipmode in ('FOB', 'SHIP')
    and l_commitdate < l_receiptdate
    and l_shipdate < l_commitdate
    and l_receiptdate >= date '1995-01-01'
    and l_receiptdate < date '1995-01-01' + interval '1' year
group by
    l_shipmode
order by
    l_shipmode;
",
    // 13
    r"select
    c_count,
    count(*) as custdist
from
    (
        select
            c_custkey,
            count(o_orderkey)
        from
            customer left outer join orders on
                c_custkey = o_custkey
                and o_comment not like '%express%requests%'
        group by
            c_custkey
    ) as c_orders (c_custkey, c_count)
group by
    c_count
order by
    custdist desc,
    c_count desc;
",
    // 14
    r"select
    100.00 * sum(case
        when p_type like 'PROMO%'
            then l_extendedprice * (1 - l_discount)
        else 0
    end) / sum(l_extendedprice * (1 - l_discount)) as promo_revenue
from
    lineitem,
    part
where
    l_partkey = p_partkey
    and l_shipdate >= date '1995-02-01'
    and l_shipdate < date '1995-02-01' + interval '1' month;
",
    // 15
    r"create view revenue0 (supplier_no, total_revenue) as
    select
        l_suppkey,
        sum(l_extendedprice * (1 - l_discount))
    from
        lineitem
    where
        l_shipdate >= date '1996-01-01'
        and l_shipdate < date '1996-01-01' + interval '3' month
    group by
        l_suppkey;


select
    s_suppkey,
    s_name,
    s_address,
    s_phone,
    total_revenue
from
    supplier,
    revenue0
where
    s_suppkey = supplier_no
    and total_revenue = (
        select
            max(total_revenue)
        from
            revenue0
    )
order by
    s_suppkey;

drop view revenue0;
",
    // 16
    r"select
    p_brand,
    p_type,
    p_size,
    count(distinct ps_suppkey) as supplier_cnt
from
    partsupp,
    part
where
    p_partkey = ps_partkey
    and p_brand <> 'Brand#14'
    and p_type not like 'SMALL PLATED%'
    and p_size in (14, 6, 5, 31, 49, 15, 41, 47)
    and ps_suppkey not in (
        select
            s_suppkey
        from
            supplier
        where
            s_comment like '%Customer%Complaints%'
    )
group by
    p_brand,
    p_type,
    p_size
order by
    supplier_cnt desc,
    p_brand,
    p_type,
    p_size;
",
    // 17
    r"select
    sum(l_extendedprice) / 7.0 as avg_yearly
from
    lineitem,
    part
where
    p_partkey = l_partkey
    and p_brand = 'Brand#42'
    and p_container = 'LG BAG'
    and l_quantity < (
        select
            0.2 * avg(l_quantity)
        from
            lineitem
        where
            l_partkey = p_partkey
    );
",
    // 18
    r"select
    c_name,
    c_custkey,
    o_orderkey,
    o_orderdate,
    o_totalprice,
    sum(l_quantity)
from
    customer,
    orders,
    lineitem
where
    o_orderkey in (
        select
            l_orderkey
        from
            lineitem
        group by
            l_orderkey having
                sum(l_quantity) > 313
    )
    and c_custkey = o_custkey
    and o_orderkey = l_orderkey
group by
    c_name,
    c_custkey,
    o_orderkey,
    o_orderdate,
    o_totalprice
order by
    o_totalprice desc,
    o_orderdate limit 100;
",
    // 19
    r"select
    sum(l_extendedprice* (1 - l_discount)) as revenue
from
    lineitem,
    part
where
    (
        p_partkey = l_partkey
        and p_brand = 'Brand#21'
        and p_container in ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
        and l_quantity >= 8 and l_quantity <= 8 + 10
        and p_size between 1 and 5
        and l_shipmode in ('AIR', 'AIR REG')
        and l_shipinstruct = 'DELIVER IN PERSON'
    )
    or
    (
        p_partkey = l_partkey
        and p_brand = 'Brand#13'
        and p_container in ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
        and l_quantity >= 20 and l_quantity <= 20 + 10
        and p_size between 1 and 10
        and l_shipmode in ('AIR', 'AIR REG')
        and l_shipinstruct = 'DELIVER IN PERSON'
    )
    or
    (
        p_partkey = l_partkey
        and p_brand = 'Brand#52'
        and p_container in ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
        and l_quantity >= 30 and l_quantity <= 30 + 10
        and p_size between 1 and 15
        and l_shipmode in ('AIR', 'AIR REG')
        and l_shipinstruct = 'DELIVER IN PERSON'
    );
",
    // 20
    r"select
    s_name,
    s_address
from
    supplier,
    nation
where
    s_suppkey in (
        select
            ps_suppkey
        from
            partsupp
        where
            ps_partkey in (
                select
                    p_partkey
                from
                    part
                where
                    p_name like 'blanched%'
            )
            and ps_availqty > (
                select
                    0.5 * sum(l_quantity)
                from
                    lineitem
                where
                    l_partkey = ps_partkey
                    and l_suppkey = ps_suppkey
                    and l_shipdate >= date '1993-01-01'
                    and l_shipdate < date '1993-01-01' + interval '1' year
            )
    )
    and s_nationkey = n_nationkey
    and n_name = 'KENYA'
order by
    s_name;
",
    // 21
    r"select
    s_name,
    count(*) as numwait
from
    supplier,
    lineitem l1,
    orders,
    nation
where
    s_suppkey = l1.l_suppkey
    and o_orderkey = l1.l_orderkey
    and o_orderstatus = 'F'
    and l1.l_receiptdate > l1.l_commitdate
    and exists (
        select
            *
        from
            lineitem l2
        where
            l2.l_orderkey = l1.l_orderkey
            and l2.l_suppkey <> l1.l_suppkey
    )
    and not exists (
        select
            *
        from
            lineitem l3
        where
            l3.l_orderkey = l1.l_orderkey
            and l3.l_suppkey <> l1.l_suppkey
            and l3.l_receiptdate > l3.l_commitdate
    )
    and s_nationkey = n_nationkey
    and n_name = 'ARGENTINA'
group by
    s_name
order by
    numwait desc,
    s_name limit 100;
",
    // 22
    r"select
    cntrycode,
    count(*) as numcust,
    sum(c_acctbal) as totacctbal
from
    (
        select
            substring(c_phone from 1 for 2) as cntrycode,
            c_acctbal
        from
            customer
        where
            substring(c_phone from 1 for 2) in
                ('24', '34', '16', '30', '33', '14', '13')
            and c_acctbal > (
                select
                    avg(c_acctbal)
                from
                    customer
                where
                    c_acctbal > 0.00
                    and substring(c_phone from 1 for 2) in
                        ('24', '34', '16', '30', '33', '14', '13')
            )
            and not exists (
                select
                    *
                from
                    orders
                where
                    o_custkey = c_custkey
            )
    ) as custsale
group by
    cntrycode
order by
    cntrycode;
",
];

/// The SQL text of query `n` (1 to 22), all its statements.
pub fn query(n: usize) -> Result<&'static str> {
    n.checked_sub(1)
        .and_then(|i| QUERIES.get(i))
        .copied()
        .ok_or_else(|| Error::InvalidOptions(format!("TPC-H has queries 1 to {QUERY_COUNT}, not {n}")))
}

/// The statements of query `n`, in order (one, except three for query 15).
pub fn statements(n: usize) -> Result<Vec<&'static str>> {
    Ok(query(n)?.split(';').map(str::trim).filter(|s| !s.is_empty()).collect())
}

/// Whether a statement returns rows (is not a `CREATE`/`DROP`).
pub fn is_query_statement(statement: &str) -> bool {
    let first = statement.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
    !matches!(first.as_str(), "create" | "drop")
}

#[cfg(feature = "datafusion")]
pub use with_datafusion::*;

#[cfg(feature = "datafusion")]
mod with_datafusion {
    use std::path::{Path, PathBuf};

    use arrow::array::RecordBatch;
    use datafusion::error::{DataFusionError, Result};
    use datafusion::prelude::{ParquetReadOptions, SessionContext};

    use gpq_datafusion::{GpqTableOptions, register_gpq};

    use super::{is_query_statement, statements};
    use crate::tpch::Table;

    /// How [`register_tables`] registers the TPC-H tables.
    #[derive(Debug, Clone)]
    pub enum TableSource {
        /// As [`GpqTable`](gpq_datafusion::GpqTable)s with these options.
        Gpq(GpqTableOptions),
        /// As DataFusion's built-in Parquet listing tables.
        Parquet,
    }

    /// Where table `t` lives in `dir`: `<dir>/<t>.parquet`, else the directory `<dir>/<t>/`.
    pub fn table_path(dir: &Path, t: Table) -> Result<PathBuf> {
        let file = dir.join(format!("{}.parquet", t.name()));
        if file.is_file() {
            return Ok(file);
        }
        let sub = dir.join(t.name());
        if sub.is_dir() {
            return Ok(sub);
        }
        Err(DataFusionError::Plan(format!(
            "TPC-H table {} not found: neither {} nor {} exists",
            t.name(),
            file.display(),
            sub.display()
        )))
    }

    /// Registers the eight TPC-H tables of `dir` with `ctx`.
    pub async fn register_tables(ctx: &SessionContext, dir: &Path, source: &TableSource) -> Result<()> {
        for t in Table::ALL {
            let path = table_path(dir, t)?;
            match source {
                TableSource::Gpq(options) => register_gpq(ctx, t.name(), &path, options.clone())?,
                TableSource::Parquet => {
                    let text = path
                        .to_str()
                        .ok_or_else(|| DataFusionError::Plan(format!("path {} is not UTF-8", path.display())))?;
                    ctx.deregister_table(t.name())?;
                    ctx.register_parquet(t.name(), text, ParquetReadOptions::default()).await?;
                }
            }
        }
        Ok(())
    }

    /// Runs query `n` (all its statements) and returns the rows of its query statement.
    ///
    /// For query 15 the view is dropped even when the query fails.
    pub async fn run_query(ctx: &SessionContext, n: usize) -> Result<Vec<RecordBatch>> {
        let statements = statements(n).map_err(gpq_datafusion::to_df_error)?;
        let mut result = None;
        let mut failure = None;
        for s in statements {
            let is_query = is_query_statement(s);
            // After a failure only the clean-up (DROP) statements still run.
            if failure.is_some() && !s.to_ascii_lowercase().starts_with("drop") {
                continue;
            }
            match ctx.sql(s).await {
                Ok(df) => match df.collect().await {
                    Ok(batches) if is_query => result = Some(batches),
                    Ok(_) => {}
                    Err(e) => failure = failure.or(Some(e)),
                },
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        result.ok_or_else(|| DataFusionError::Plan(format!("TPC-H query {n} has no query statement")))
    }

    /// The lines of `batches` as a printed table, sorted: two results with
    /// the same sorted lines hold the same rows, whatever the order of rows
    /// tied under ORDER BY.
    pub fn sorted_lines(batches: &[RecordBatch]) -> Result<Vec<String>> {
        let text = arrow::util::pretty::pretty_format_batches(batches)?.to_string();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort_unstable();
        Ok(lines)
    }

    /// Whether two results hold the same rows, in any order (see [`sorted_lines`]).
    pub fn same_rows(expected: &[RecordBatch], actual: &[RecordBatch]) -> Result<bool> {
        Ok(sorted_lines(expected)? == sorted_lines(actual)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_queries_present() {
        for n in 1..=QUERY_COUNT {
            let s = statements(n).unwrap();
            assert_eq!(s.iter().filter(|s| is_query_statement(s)).count(), 1, "query {n}");
            assert_eq!(s.len(), if n == 15 { 3 } else { 1 });
        }
        assert!(query(0).is_err());
        assert!(query(23).is_err());
    }
}
