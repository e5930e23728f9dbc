const unused = 1;
console.log(undefinedName);
function f(a) {
  return a == null;
}
