pub fn helper() -> i32 {
    let never_read = 5;
    1
}
