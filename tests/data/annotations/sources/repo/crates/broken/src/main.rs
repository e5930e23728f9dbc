fn takes_one(x: i32) -> i32 {
    x + outside::helper()
}

fn main() {
    let unused = 1;
    let n: i32 = "seven";
    takes_one(1, 2);
}
