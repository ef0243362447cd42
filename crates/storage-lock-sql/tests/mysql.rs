//! Both suites against [`MysqlStorage`] on the server named by `STORAGE_LOCK_MYSQL_URL`
//! (`scripts/services.sh` starts MariaDB and sets it). The tests share one table; each uses keys
//! under a prefix of its own.

use storage_lock_sql::MysqlStorage;

async fn mysql() -> MysqlStorage {
    let url = std::env::var("STORAGE_LOCK_MYSQL_URL")
        .expect("STORAGE_LOCK_MYSQL_URL must name a MySQL/MariaDB server (run scripts/test.sh)");
    MysqlStorage::builder()
        .url(url)
        .table("storage_lock_suite")
        .open()
        .await
        .expect("connect to MySQL/MariaDB")
}

storage_lock_testkit::storage_lock_suites!(mysql);
