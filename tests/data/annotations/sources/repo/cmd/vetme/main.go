package main

import "fmt"

func main() {
	name := "kodx"
	fmt.Printf("%d\n", name)
	var x int
	x = x
}
